#!/usr/bin/env python3
"""Logit parity with llama.cpp on synthetic random-weight models of every architecture.

  parity.py check  TERRACE REFS.json   — make test: regenerate each synthetic model (deterministic,
                                         its sha256 must match the one the reference was made
                                         from), run `terrace logits`, compare with the stored
                                         llama.cpp logits; no llama.cpp needed
  parity.py record TERRACE REFS.json   — make parity: run llama.cpp (.venv-peer) on the same files
                                         and tokens, store its top-K logits per position, and
                                         compare live, including Q4_K_M files quantized by llama.cpp
  check ... [--archs A1,A2] [--types T1,T2] [--one-batch]
                                       — a subset (the emulated aarch64 suite, within its time):
                                         those architectures and weight types, one batch of 512

What is stored per (arch, type): the model file's sha256, the token ids, and for each position
llama.cpp's top-K token ids with their logits. Compared: top-1 agreement (terrace's argmax ==
llama.cpp's, a position where llama.cpp's own top-2 margin is below the type's median noise bound
counting as a near tie), and the largest |terrace - llama.cpp| over the stored entries.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import synth  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PEER_PY = os.path.join(ROOT, ".venv-peer", "bin", "python3")
TOPK = 16
N_TOKENS = 256
TYPES = ["F32", "F16", "Q8_0"]
# Tolerances. Both sides round the same things (K/V and attention operands to F16, activations to
# Q8_0/Q8_K before quantized matmuls) and differ only in float summation order (~1e-6 relative),
# but every rounding step turns that noise into occasional one-step jumps (2^-11 relative for an
# F16 rounding, amax/127 of a block for a Q8 activation) that later layers carry on. Observed
# (llama.cpp 0.3.36 build, logit spread ~20 here, 256 positions):
#   median over positions of max |dlogit|: F32 <= 2.1e-3 (gpt-oss, 4 layers; dense <= 9e-4),
#   F16 <= 1.4e-2, Q8_0 <= 0.31, Q4_K_M <= 0.42
#   max over positions:                     F32 <= 2.5e-3, F16 <= 1.6e-2, Q8_0 <= 0.41, Q4_K_M <= 0.56
# Limits are ~3x those. Top-1 agreement >= 99% is required for F32/F16/Q8_0; Q4_K_M is
# reported (observed >= 98.4%). Kernel-level errors are caught exactly by test_kernels; these
# limits catch formula errors in the forward pass, which move every position's logits.
MIN_TOP1 = {"F32": 0.99, "F16": 0.99, "Q8_0": 0.99, "Q4_K_M": 0.97}
MAX_MEDIAN = {"F32": 5e-3, "F16": 2e-2, "Q8_0": 0.45, "Q4_K_M": 0.6}
MAX_ABS = {"F32": 1e-2, "F16": 5e-2, "Q8_0": 1.2, "Q4_K_M": 1.6}
# MoE models add one more discrete step: a row whose k-th and (k+1)-th router probabilities are
# within that noise of each other may pick the other expert on one side, which moves that
# position's logits by O(1). It shows in the max only (the median stays at the dense level), so
# for MoE architectures the max bound is relaxed and the median keeps the dense bound.
MAX_ABS_MOE = {"F32": 5e-2, "F16": 1.0, "Q8_0": 2.0, "Q4_K_M": 4.0}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def terrace_logits(terrace, model, toks, batch, out, extra=()):
    subprocess.run([terrace, "logits", "-m", model, "--tokens", ",".join(map(str, toks)),
                    "-b", str(batch), "--out", out, *extra], check=True)
    return np.fromfile(out, dtype=np.float32).reshape(len(toks), -1)


def compare(ref, got, tie):
    """ref: {"ids": [[...]*TOPK]*n, "logits": [[...]]}; got: full [n][n_vocab]. Top-1 agreement
    counts a position where llama.cpp's own top-1/top-2 margin is below `tie` (the type's median
    logit noise bound) as agreeing: a near tie that equally valid summation orders break either
    way (the x86 and Arm kernel families disagree with each other there too). Also returned: the
    plain agreement."""
    ids = np.array(ref["ids"])
    vals = np.array(ref["logits"], dtype=np.float32)
    same = got.argmax(axis=1) == ids[:, 0]
    top1 = float(np.mean(same | (vals[:, 0] - vals[:, 1] < tie)))
    per_pos = np.max(np.abs(np.take_along_axis(got, ids, axis=1) - vals), axis=1)
    return top1, float(np.mean(same)), float(np.median(per_pos)), float(per_pos.max())


def record_entry(model, toks, tmp):
    out = os.path.join(tmp, "ref.f32")
    subprocess.run([PEER_PY, os.path.join(HERE, "llama_ref.py"), "logits", model,
                    ",".join(map(str, toks)), out], check=True, stdout=subprocess.DEVNULL)
    full = np.fromfile(out, dtype=np.float32).reshape(len(toks), -1)
    ids = np.argsort(-full, axis=1, kind="stable")[:, :TOPK]
    return full, {"ids": ids.tolist(),
                  "logits": np.take_along_axis(full, ids, axis=1).round(6).tolist()}


def main():
    mode, terrace, refs_path = sys.argv[1], sys.argv[2], sys.argv[3]
    opts = sys.argv[4:]
    only_types = opts[opts.index("--types") + 1].split(",") if "--types" in opts else None
    only_archs = opts[opts.index("--archs") + 1].split(",") if "--archs" in opts else None
    one_batch = "--one-batch" in opts
    toks = synth.token_sequence(N_TOKENS)
    refs = {}
    if mode == "check":
        with open(refs_path) as f:
            refs = json.load(f)
    failures, rows = 0, []
    with tempfile.TemporaryDirectory(prefix="terrace-parity-") as tmp:
        for arch in list(synth.ARCHS) + list(synth.MOE_ARCHS):
            if only_archs and arch not in only_archs:
                continue
            types = TYPES + (["Q4_K_M"] if mode == "record" else [])
            if only_types:
                types = [t for t in types if t in only_types]
            for qt in types:
                key = f"{arch}/{qt}"
                path = os.path.join(tmp, f"{arch}-{qt}.gguf")
                if qt == "Q4_K_M":
                    f16 = os.path.join(tmp, f"{arch}-F16.gguf")
                    subprocess.run([PEER_PY, os.path.join(HERE, "llama_ref.py"), "quantize", f16,
                                    path, "15"], check=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                else:
                    synth.write(arch, qt, path)
                digest = sha256(path)
                if mode == "record":
                    full, entry = record_entry(path, toks, tmp)
                    entry["sha256"] = digest
                    entry["tokens"] = toks
                    refs[key] = entry
                else:
                    entry = refs.get(key)
                    if entry is None:
                        print(f"FAIL {key}: no stored reference (run make parity)")
                        failures += 1
                        continue
                    if entry["sha256"] != digest:
                        print(f"FAIL {key}: the synthetic model differs from the one the reference was "
                              f"made from (sha256 {digest[:12]} != {entry['sha256'][:12]}); "
                              f"run `make parity` to re-record")
                        failures += 1
                        continue
                # terrace, in one batch and in ragged chunks of 7 (prefill chunking must not
                # change the result); MoE models also with the expert cache at its smallest
                # legal budget and with plain mmap experts: the budget must never change the
                # output, bit for bit
                runs = [(512, ()), (7, ())]
                if one_batch:
                    runs = [(512, ())]
                elif arch in synth.MOE_ARCHS:
                    runs += [(512, ("--expert-cache", "min")), (512, ("--experts", "mmap"))]
                first = None
                for batch, extra in runs:
                    got = terrace_logits(terrace, path, toks, batch, os.path.join(tmp, "t.f32"),
                                         extra)
                    if extra:
                        same = np.array_equal(got, first)
                        failures += not same
                        rows.append((f"{key} {' '.join(extra)}", batch, 1.0 if same else 0.0,
                                     1.0 if same else 0.0, 0.0, 0.0 if same else float("inf"),
                                     same))
                        continue
                    if first is None:
                        first = got
                    top1, raw, med, diff = compare(entry, got, MAX_MEDIAN[qt])
                    max_abs = (MAX_ABS_MOE if arch in synth.MOE_ARCHS else MAX_ABS)[qt]
                    ok = top1 >= MIN_TOP1[qt] and med <= MAX_MEDIAN[qt] and diff <= max_abs
                    failures += not ok
                    rows.append((key, batch, top1, raw, med, diff, ok))
    print(f"{'model':16s} {'batch':>5s} {'top-1 agree':>11s} {'plain':>12s} {'median':>9s} "
          f"{'max |dlogit|':>12s}")
    for key, batch, top1, raw, med, diff, ok in rows:
        if " --" in key:
            print(f"{key:40s} {'identical to the default run' if ok else 'DIFFERS from the default run: FAIL'}")
            continue
        print(f"{key:16s} {batch:5d} {100 * top1:10.1f}% {100 * raw:11.1f}% {med:9.2e} {diff:12.2e}  "
              f"{'ok' if ok else 'FAIL'}")
    if mode == "record":
        with open(refs_path, "w") as f:
            json.dump(refs, f, separators=(",", ":"))
        print(f"recorded {len(refs)} references into {refs_path}")
    print("parity: " + ("all checks passed" if not failures else f"{failures} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
