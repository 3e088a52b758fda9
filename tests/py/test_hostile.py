#!/usr/bin/env python3
"""Hostile and corrupt GGUF files: each must give a clear error naming what and where (key or
tensor name, byte offset), exit status 1, and no crash, hang or out-of-bounds read — the binary
under test is the AddressSanitizer/UBSan build of `terrace inspect`.

Files are assembled byte by byte here (not with the gguf writer, which refuses to write most of
them), so every field is under the test's control.

usage: test_hostile.py TERRACE_BINARY [OUTDIR_FOR_FUZZ_SEEDS]
"""
import os
import struct
import subprocess
import sys
import tempfile

TERRACE = sys.argv[1]
SEED_DIR = sys.argv[2] if len(sys.argv) > 2 else None
from tally import check, verdict  # noqa: E402


# ---- a tiny GGUF assembler ------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
       U64: "<Q", I64: "<q", F64: "<d"}


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value, elem=None):
    out = s(key) + struct.pack("<I", vtype)
    if vtype == STR:
        return out + s(value)
    if vtype == ARR:
        out += struct.pack("<IQ", elem, len(value))
        for v in value:
            out += s(v) if elem == STR else struct.pack(FMT[elem], v)
        return out
    return out + struct.pack(FMT[vtype], value)


def tinfo(name, dims, ttype, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ttype, offset)


def gguf(kvs, tinfos, data=b"", version=3, n_kv=None, n_tensors=None, align=32, magic=b"GGUF"):
    head = magic + struct.pack("<IQQ", version, len(tinfos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tinfos)
    if tinfos:
        body += b"\0" * ((align - len(body) % align) % align)
    return body + data


ARCH = kv("general.architecture", STR, "llama")
F32_T = 0
Q4_0_T = 2


def valid():
    """a small valid file: two F32 tensors of 8 elements (32 bytes each)"""
    return gguf([ARCH, kv("llama.block_count", U32, 1)],
                [tinfo("a.weight", [8], F32_T, 0), tinfo("b.weight", [8], F32_T, 32)],
                b"\x01" * 64)


# ---- the cases: (name, bytes, substrings the error must contain) -----------------------------
def cases():
    v = valid()
    yield "valid", v, None
    yield "empty-array", gguf([ARCH, kv("x.empty", ARR, [], elem=I32)], []), None
    yield "no-tensors", gguf([ARCH], []), None
    yield "empty-file", b"", ["truncated", "magic"]
    yield "bad-magic", b"GGML" + v[4:], ["bad magic", "GGML", "byte 0"]
    yield "version-1", v[:4] + struct.pack("<I", 1) + v[8:], ["version 1"]
    yield "version-4", v[:4] + struct.pack("<I", 4) + v[8:], ["version 4"]
    yield "big-endian", v[:4] + struct.pack(">I", 3) + v[8:], ["big-endian"]
    for cut in (3, 10, 20, 30, 60, len(v) - 70, len(v) - 40, len(v) - 1):
        yield f"truncated-at-{cut}", v[:cut], ["truncated" if cut < len(v) - 64 else "runs past"]
    yield "absurd-tensor-count", gguf([ARCH], [], n_tensors=1 << 60), ["tensor count", "absurd"]
    yield "absurd-kv-count", gguf([ARCH], [], n_kv=(1 << 64) - 1), ["metadata count", "absurd"]
    yield "absurd-key-length", v[:24] + struct.pack("<Q", 1 << 62) + v[32:], \
        ["metadata key", "byte 24", "length"]
    bad_str = s("general.architecture") + struct.pack("<IQ", STR, 1 << 40) + b"llama"
    yield "absurd-string-length", gguf([bad_str], []), ["general.architecture", "length"]
    big_arr = s("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARR, STR, 1 << 50)
    yield "absurd-array-count", gguf([ARCH, big_arr], []), ["tokenizer.ggml.tokens", "elements"]
    yield "unknown-value-type", gguf([s("x.y") + struct.pack("<I", 13) + b"\0" * 8], []), \
        ["x.y", "unknown value type 13"]
    nested = s("x.nested") + struct.pack("<IIQ", ARR, ARR, 1) + struct.pack("<IQ", U8, 0)
    yield "nested-array", gguf([nested], []), ["x.nested", "nests arrays"]
    yield "duplicate-key", gguf([ARCH, kv("llama.block_count", U32, 1), kv("llama.block_count", U32, 2)],
                                []), ["duplicate metadata key", "llama.block_count", "byte"]
    yield "empty-key", gguf([s("") + struct.pack("<IB", U8, 1)], [], b"\0" * 8), ["empty metadata key"]
    yield "tensor-past-eof", gguf([ARCH], [tinfo("big.weight", [1024], F32_T, 0)], b"\0" * 64), \
        ["big.weight", "runs past the end"]
    yield "tensor-offset-past-eof", gguf([ARCH], [tinfo("far.weight", [8], F32_T, 1 << 40)],
                                         b"\0" * 32), ["far.weight", "runs past the end"]
    yield "overlapping", gguf([ARCH], [tinfo("a.weight", [16], F32_T, 0),
                                       tinfo("b.weight", [8], F32_T, 32)], b"\0" * 64), \
        ["a.weight", "b.weight", "overlap"]
    yield "misaligned", gguf([ARCH], [tinfo("m.weight", [8], F32_T, 4)], b"\0" * 64), \
        ["m.weight", "not a multiple of the alignment 32"]
    yield "unknown-type", gguf([ARCH], [tinfo("u.weight", [32], 99, 0)], b"\0" * 256), \
        ["u.weight", "unknown type id 99"]
    yield "removed-type", gguf([ARCH], [tinfo("r.weight", [32], 4, 0)], b"\0" * 256), \
        ["r.weight", "unknown type id 4"]
    yield "duplicate-tensor", gguf([ARCH], [tinfo("d.weight", [8], F32_T, 0),
                                            tinfo("d.weight", [8], F32_T, 32)], b"\0" * 64), \
        ["duplicate tensor name", "d.weight"]
    yield "zero-dims", gguf([ARCH], [tinfo("z.weight", [], F32_T, 0)], b"\0" * 32), \
        ["z.weight", "0 dimensions"]
    yield "five-dims", gguf([ARCH], [tinfo("f.weight", [1, 1, 1, 1, 1], F32_T, 0)], b"\0" * 32), \
        ["f.weight", "5 dimensions"]
    yield "dim-overflow", gguf([ARCH], [tinfo("o.weight", [1 << 40, 1 << 40], F32_T, 0)], b"\0" * 32), \
        ["o.weight", "overflow"]
    yield "negative-dim", gguf([ARCH], [tinfo("n.weight", [(1 << 64) - 1], F32_T, 0)], b"\0" * 32), \
        ["n.weight", "absurd shape"]
    yield "bytes-overflow", gguf([ARCH], [tinfo("b.weight", [1 << 61, 4], F32_T, 0)], b"\0" * 32), \
        ["b.weight", "overflow"]
    yield "ragged-block", gguf([ARCH], [tinfo("q.weight", [33], Q4_0_T, 0)], b"\0" * 64), \
        ["q.weight", "not a multiple of the Q4_0 block size 32"]
    yield "long-tensor-name", gguf([ARCH], [tinfo("x" * 64, [8], F32_T, 0)], b"\0" * 32), \
        ["invalid name", "64 bytes"]
    yield "alignment-not-pow2", gguf([ARCH, kv("general.alignment", U32, 48)], []), \
        ["general.alignment", "power of two"]
    yield "alignment-wrong-type", gguf([ARCH, kv("general.alignment", U64, 64)], []), \
        ["general.alignment", "u64"]
    yield "alignment-zero", gguf([ARCH, kv("general.alignment", U32, 0)], []), \
        ["general.alignment"]
    yield "split-without-name", gguf([ARCH, kv("split.no", U16, 0), kv("split.count", U16, 3)], []), \
        ["split", "NNNNN-of-NNNNN"]


def run(path):
    env = dict(os.environ, ASAN_OPTIONS="exitcode=86:detect_leaks=1",
               UBSAN_OPTIONS="exitcode=87:print_stacktrace=1")
    try:
        r = subprocess.run([TERRACE, "inspect", path], capture_output=True, text=True,
                           timeout=20, env=env, errors="replace")
    except subprocess.TimeoutExpired:
        return None, "", "TIMEOUT"
    return r.returncode, r.stdout, r.stderr


def main():
    tmp = tempfile.mkdtemp(prefix="terrace-hostile-")
    n = 0
    for name, data, expect in cases():
        p = os.path.join(tmp, name + ".gguf")
        with open(p, "wb") as f:
            f.write(data)
        if SEED_DIR:
            os.makedirs(SEED_DIR, exist_ok=True)
            with open(os.path.join(SEED_DIR, "seed-" + name), "wb") as f:
                f.write(data)
        rc, out, err = run(p)
        n += 1
        sanitizer = "Sanitizer" in err or "runtime error" in err
        if expect is None:
            check(rc == 0 and not sanitizer, f"{name}: valid file rejected: rc {rc} {err.strip()}")
            continue
        missing = [e for e in expect if e.lower() not in err.lower()]
        check(rc == 1 and not sanitizer and not missing and err.startswith("terrace: error: "),
              f"{name}: rc {rc}, missing {missing} in: {err.strip()[:600]}")
        print(f"  {name:26s} rc={rc}  {err.strip()[:150]}")
    # not a file at all
    for name, path, expect in [("nonexistent", os.path.join(tmp, "nope.gguf"), "cannot open"),
                               ("directory", tmp, "is a directory")]:
        rc, out, err = run(path)
        check(rc == 1 and expect in err, f"{name}: rc {rc} {err.strip()}")
        n += 1
    # an unreadable file (when not running as root, which bypasses permissions)
    if os.geteuid() != 0:
        p = os.path.join(tmp, "valid-unreadable.gguf")
        with open(p, "wb") as f:
            f.write(valid())
        os.chmod(p, 0)
        rc, out, err = run(p)
        check(rc == 1 and "Permission denied" in err, f"unreadable: rc {rc} {err.strip()}")
    for f in os.listdir(tmp):
        os.chmod(os.path.join(tmp, f), 0o600)
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    return verdict("test_hostile", f"{n} cases, ")


if __name__ == "__main__":
    sys.exit(main())
