#!/usr/bin/env python3
"""GGUF reader test: files written by the PyPI `gguf` writer, read back by `terrace inspect --json`
and by tests/test_gguf (data access), compared with what was written and with gguf's own
GGUFReader (an independent reader) — every value type, arrays, custom alignment, GGUF v2,
split files.

usage: test_gguf_reader.py TERRACE_BINARY TEST_GGUF_BINARY
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V

TERRACE, TEST_GGUF = sys.argv[1], sys.argv[2]
from tally import check, verdict  # noqa: E402


def inspect_json(path):
    r = subprocess.run([TERRACE, "inspect", "--json", path], capture_output=True, text=True)
    check(r.returncode == 0, f"inspect {path} exited {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout) if r.returncode == 0 else None


# every scalar type, with edge values
SCALARS = [
    ("t.u8", 255, V.UINT8), ("t.i8", -128, V.INT8), ("t.u16", 65535, V.UINT16),
    ("t.i16", -32768, V.INT16), ("t.u32", 4294967295, V.UINT32), ("t.i32", -2147483648, V.INT32),
    ("t.f32", 0.15625, V.FLOAT32), ("t.bool_true", True, V.BOOL), ("t.bool_false", False, V.BOOL),
    ("t.string", "héllo wörld ✓", V.STRING), ("t.empty_string", "", V.STRING),
    ("t.u64", 2**53, V.UINT64), ("t.i64", -(2**40), V.INT64), ("t.f64", -2.5e-300, V.FLOAT64),
]
ARRAYS = [
    ("a.u8", [0, 1, 255], V.UINT8), ("a.i8", [-1, 0, 127], V.INT8), ("a.u16", [1, 2], V.UINT16),
    ("a.i16", [-7, 7], V.INT16), ("a.u32", [1, 2, 3, 4], V.UINT32), ("a.i32", [-5, 5], V.INT32),
    ("a.f32", [0.5, -1.25], V.FLOAT32), ("a.bool", [True, False, True], V.BOOL),
    ("a.string", ["a", "", "ünïcode", "x y"], V.STRING), ("a.u64", [2**40, 3], V.UINT64),
    ("a.i64", [-(2**40), 9], V.INT64), ("a.f64", [1e100, -0.0], V.FLOAT64),
]


def write_model(path, alignment=None, split_max_tensors=0):
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    if alignment:
        w.add_custom_alignment(alignment)
    for key, val, vt in SCALARS:
        w.add_key_value(key, val, vt)
    for key, vals, et in ARRAYS:
        w.add_key_value(key, vals, V.ARRAY, sub_type=et)
    w.add_key_value("a.long", list(range(100)), V.ARRAY, sub_type=V.UINT32)
    w.add_block_count(2)
    w.add_context_length(4096)
    rng = np.random.default_rng(7)
    w.add_tensor("tok.f32", np.arange(96, dtype=np.float32).reshape(3, 32))
    w.add_tensor("odd.f16", rng.standard_normal((5, 7)).astype(np.float16))
    w.add_tensor("vec.f32", np.arange(3, dtype=np.float32))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0)
    w.add_tensor("w.q8_0", q, raw_dtype=T.Q8_0)
    q = gguf.quants.quantize(rng.standard_normal((2, 3, 64)).astype(np.float32), T.Q4_0)
    w.add_tensor("w3d.q4_0", q, raw_dtype=T.Q4_0)
    raw = rng.integers(0, 256, size=(2, 144 * 2), dtype=np.uint8)
    raw[:, 0:2] = np.array([0.01], dtype=np.float16).view(np.uint8)
    w.add_tensor("w.q4_k", raw, raw_dtype=T.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


VTYPE_NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32",
               V.INT32: "i32", V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string",
               V.UINT64: "u64", V.INT64: "i64", V.FLOAT64: "f64"}


def same_value(got, want, vt):
    # the written values are exactly representable, so floats must come back exactly
    return got == want and type(got) is type(want) if vt == V.BOOL else got == want


def check_metadata(doc, label):
    md = doc["metadata"]
    for key, val, vt in SCALARS:
        e = md.get(key)
        check(e is not None, f"{label}: key {key} missing")
        if e is None:
            continue
        check(e["type"] == VTYPE_NAMES[vt], f"{label}: {key} has type {e['type']}")
        got = e["value"]
        if vt == V.UINT64 and isinstance(got, str):
            got = int(got)
        check(same_value(got, val, vt), f"{label}: {key} = {got!r}, wrote {val!r}")
    for key, vals, et in ARRAYS:
        e = md.get(key)
        check(e is not None and e["type"] == "array", f"{label}: array {key} missing")
        if e is None:
            continue
        check(e["value"] == vals, f"{label}: {key} = {e['value']!r}, wrote {vals!r}")
    long = md["a.long"]["value"]
    check(long["length"] == 100 and long["head"] == list(range(8)), f"{label}: long array summary")
    hp = doc["hyperparameters"]
    check(hp["block_count"]["value"] == 2 and hp["context_length"]["value"] == 4096,
          f"{label}: hyperparameters {hp}")


def check_tensors_against_gguf_reader(doc, paths, label):
    """terrace's offsets/sizes/types/shapes vs gguf.GGUFReader, shard by shard"""
    want = []
    for shard, p in enumerate(paths):
        r = gguf.GGUFReader(p)
        for t in r.tensors:
            want.append((t.name, t.tensor_type.name, [int(x) for x in t.shape], int(t.data_offset),
                         int(t.n_bytes), shard))
    got = [(t["name"], t["type"], t["shape"], t["offset"], t["bytes"], t.get("shard", 0))
           for t in doc["tensors"]]
    check(got == want, f"{label}: tensor table differs from gguf.GGUFReader:\n got {got}\nwant {want}")


def run_data_test(path):
    r = subprocess.run([TEST_GGUF, path], capture_output=True, text=True)
    check(r.returncode == 0, f"test_gguf {path}: {r.stdout}{r.stderr}")


def main():
    tmp = tempfile.mkdtemp(prefix="terrace-gguf-")
    try:
        # 1. all value types, default alignment
        p = os.path.join(tmp, "all-types.gguf")
        write_model(p)
        doc = inspect_json(p)
        if doc:
            check(doc["gguf_version"] == 3 and doc["alignment"] == 32, "version/alignment")
            check(doc["architecture"] == "llama", "architecture")
            check_metadata(doc, "all-types")
            check_tensors_against_gguf_reader(doc, [p], "all-types")
        run_data_test(p)

        # 2. custom alignment
        p = os.path.join(tmp, "align64.gguf")
        write_model(p, alignment=64)
        doc = inspect_json(p)
        if doc:
            check(doc["alignment"] == 64, f"alignment {doc['alignment']}")
            check(all(t["offset"] % 64 == 0 for t in doc["tensors"]), "tensors 64-aligned")
            check(doc["shards"][0]["data_offset"] % 64 == 0, "data section 64-aligned")
            check_tensors_against_gguf_reader(doc, [p], "align64")
        run_data_test(p)

        # 3. GGUF v2 (same layout for little-endian files; only the version field differs)
        p2 = os.path.join(tmp, "v2.gguf")
        shutil.copy(os.path.join(tmp, "all-types.gguf"), p2)
        with open(p2, "r+b") as f:
            f.seek(4)
            f.write((2).to_bytes(4, "little"))
        doc = inspect_json(p2)
        if doc:
            check(doc["gguf_version"] == 2, "v2 version")
            check_metadata(doc, "v2")

        # 4. split files: 6 tensors, 2 per shard -> 3 shards; open by the first and the last name
        base = os.path.join(tmp, "split.gguf")
        write_model(base, split_max_tensors=2)
        shards = [os.path.join(tmp, f"split-{i:05d}-of-00003.gguf") for i in (1, 2, 3)]
        check(all(os.path.exists(s) for s in shards), f"writer produced {os.listdir(tmp)}")
        for entry in (shards[0], shards[2]):
            doc = inspect_json(entry)
            if doc:
                check(len(doc["shards"]) == 3, f"split via {entry}: {len(doc['shards'])} shards")
                check(doc["n_tensors"] == 6, f"split: n_tensors {doc['n_tensors']}")
                check(doc["metadata"]["split.count"]["value"] == 3, "split.count")
                check_metadata(doc, "split")
                check_tensors_against_gguf_reader(doc, shards, "split")
        run_data_test(shards[0])
        # a missing shard is an error naming the file
        os.rename(shards[1], shards[1] + ".moved")
        r = subprocess.run([TERRACE, "inspect", shards[0]], capture_output=True, text=True)
        check(r.returncode == 1 and "00002-of-00003" in r.stderr,
              f"missing shard: rc {r.returncode}, {r.stderr.strip()}")
        os.rename(shards[1] + ".moved", shards[1])

        # 5. MoE file: per-expert byte sizes and one token's working set
        p = os.path.join(tmp, "tiny-moe.gguf")
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run([sys.executable, os.path.join(here, "..", "..", "scripts", "gen_tiny_model.py"), p],
                       check=True)
        doc = inspect_json(p)
        if doc:
            ex = doc.get("experts")
            check(ex is not None, "MoE file: no experts section")
            r = gguf.GGUFReader(p)
            want = {t.name: int(t.n_bytes) // int(t.shape[-1]) for t in r.tensors if "_exps" in t.name}
            got = {t["name"]: t["bytes_per_expert"] for t in ex["tensors"]}
            check(got == want, f"bytes per expert {got} != {want}")
            per_layer = sum(v for k, v in want.items() if k.startswith("blk.0."))
            check(ex["token_working_set_bytes"] == 2 * 2 * per_layer,
                  f"working set {ex['token_working_set_bytes']} != 2 layers x top-2 x {per_layer}")

        # 6. text output mentions the same facts
        r = subprocess.run([TERRACE, "inspect", os.path.join(tmp, "all-types.gguf")],
                           capture_output=True, text=True)
        check(r.returncode == 0 and "w.q4_k" in r.stdout and "Q4_K" in r.stdout
              and "héllo wörld ✓" in r.stdout, "text output")
    finally:
        shutil.rmtree(tmp)
    return verdict("test_gguf_reader")


if __name__ == "__main__":
    sys.exit(main())
