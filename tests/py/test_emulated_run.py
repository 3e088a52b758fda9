#!/usr/bin/env python3
"""`terrace run` under emulation (another ISA's build, through a wrapper that starts the emulator)
against the native build and the stored llama.cpp references, on a real model.

  test_emulated_run.py NATIVE_TERRACE EMULATED_TERRACE REFS.json MODEL_KEY N

For each of parity_real.py's prompts, greedy `terrace run` (--temp 0, N tokens, end-of-generation
ignored) on both builds:
  - the prompt's token ids (--verbose) must be llama.cpp's stored ids, on both;
  - the generated ids (--telemetry) must be the native build's, or first differ at a step where
    the native build's own top-1/top-2 logit margin (`terrace logits --greedy`) is below
    parity_real.MARGIN_TOL: a near-tie that the kernels' different float summation order may break
    either way, which is printed with its margin;
  - and the emulated ids against llama.cpp's stored greedy continuation, the same way (its stored
    margins), i.e. the parity references hold under emulation too.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import parity_real  # noqa: E402


def run_greedy(terrace, model, prompt, n, tmp):
    tel = os.path.join(tmp, "tel.jsonl")
    r = subprocess.run([terrace, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
                        "--ignore-eos", "--no-display-prompt", "--verbose", "--telemetry", tel],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{terrace} run failed ({r.returncode}): {r.stderr[-2000:]}")
    ids = None
    for line in r.stderr.splitlines():
        if line.startswith("terrace: prompt tokens"):
            ids = [int(x) for x in line.split(":", 2)[2].split()]
        if line.startswith("terrace: model"):
            summary = line
    with open(tel) as f:
        gen = [json.loads(line)["id"] for line in f if line.strip()]
    return ids, gen, r.stdout, summary


def first_diff(a, b):
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def main():
    native, emulated, refs_path, key, n = sys.argv[1:6]
    n = int(n)
    with open(refs_path) as f:
        entry = json.load(f)[key]
    model = parity_real.model_path(key)
    failures = 0
    print(f"== {key}: {entry['model']}, greedy `terrace run` of {n} tokens")
    with tempfile.TemporaryDirectory(prefix="terrace-emu-") as tmp:
        for pr in entry["prompts"]:
            p = pr["text"]
            ids_n, gen_n, text_n, _ = run_greedy(native, model, p, n, tmp)
            ids_e, gen_e, text_e, summary = run_greedy(emulated, model, p, n, tmp)
            label = repr(p[:36])
            if ids_e != pr["ids"] or ids_n != pr["ids"]:
                print(f"  FAIL tokenization of {label}: emulated {ids_e}, native {ids_n}, "
                      f"llama.cpp {pr['ids']}")
                failures += 1
                continue
            # against the native build
            k = first_diff(gen_e, gen_n)
            tie = k  # a step explained by the native near-tie (checked below)
            if k is None:
                vs_native = f"{n}/{n} identical to native"
            else:
                g = json.loads(subprocess.run(
                    [native, "logits", "-m", model, "--tokens", ",".join(map(str, pr["ids"])),
                     "--greedy", str(k + 1)], check=True, capture_output=True, text=True).stdout)
                if g["tokens"][:k + 1] != gen_n[:k + 1]:
                    print(f"  FAIL {label}: native `run` and `logits --greedy` differ before step "
                          f"{k}: {gen_n[:k + 1]} vs {g['tokens']}")
                    failures += 1
                    continue
                margin = g["margins"][k]
                if margin < parity_real.MARGIN_TOL:
                    vs_native = (f"first differs from native at step {k} (native {gen_n[k]}, "
                                 f"emulated {gen_e[k]}), a near-tie: native top-2 margin "
                                 f"{margin:.3f} < {parity_real.MARGIN_TOL}")
                else:
                    print(f"  FAIL {label}: emulated differs from native at step {k} where the "
                          f"native margin is {margin:.3f}: {gen_e[:k + 1]} vs {gen_n[:k + 1]}")
                    failures += 1
                    continue
            # against llama.cpp's stored greedy continuation
            want = pr["greedy"][:n]
            k = first_diff(gen_e, want)
            if k is None:
                vs_ref = "identical to llama.cpp"
            elif pr["margins"][k] < parity_real.MARGIN_TOL or k == tie:
                vs_ref = (f"first differs from llama.cpp at step {k}, its margin "
                          f"{pr['margins'][k]:.3f}" + (" (the native near-tie)" if k == tie else ""))
            else:
                print(f"  FAIL {label}: emulated differs from llama.cpp at step {k} (its margin "
                      f"{pr['margins'][k]:.3f}): {gen_e[:k + 1]} vs {want[:k + 1]}")
                failures += 1
                continue
            print(f"  ok   {label}: {vs_native}; {vs_ref}")
        print(f"  ({summary.strip()})")
    print("test_emulated_run: " + ("all checks passed" if not failures else f"{failures} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
