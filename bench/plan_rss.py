#!/usr/bin/env python3
"""The memory plan against the peak RSS measured (make bench-plan; results in
bench/results/long.md).

For a dense model (SmolLM2-135M, real), a synthetic MoE model through the expert cache and,
given --qwen2, Qwen2.5-Coder-0.5B: `terrace run` under several --mem-budget values (and the
automatic cap), with a prompt that fills most of the context (RSS counts the KV pages written,
not those planned), 8 tokens generated. Each row is the plan's total without its margin (weights
+ expert cache + KV + scratch + the process's own pages as loading began: code, libraries,
stacks), the peak RSS the run measured (VmHWM) and their ratio; a row outside 0.90..1.10 is
marked.

usage: plan_rss.py [--qwen2] [--check]   (--check: exit 1 if a real model's row is off by > 10 %)
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TERRACE = os.environ.get("TERRACE_BIN", os.path.join(ROOT, "build", "terrace"))
PY = os.path.join(ROOT, ".venv", "bin", "python3")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_long import kjv, model  # noqa: E402


def run(m, prompt_file, ctx, budget, extra=()):
    args = [TERRACE, "run", "-m", m, "-f", prompt_file, "-n", "8", "--ignore-eos", "-c", str(ctx),
            "-t", "2", *extra]
    if budget:
        args += ["--mem-budget", budget]
    env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(prefix="terrace-plan-"))
    r = subprocess.run(args, capture_output=True, text=True, env=env, errors="replace")
    if r.returncode:
        return None, r.stderr.strip().splitlines()[-1]
    g = re.search(r"plan without the margin ([\d.]+) MiB, peak RSS ([\d.]+) MiB", r.stderr)
    pol = re.search(r"\+ KV [\d.]+ MiB \((\w+)\)", r.stderr)
    ctxu = re.search(r"context (\d+)/(\d+)", r.stderr)
    return (float(g.group(1)), float(g.group(2)), pol.group(1), ctxu.group(1)), None


def main():
    check = "--check" in sys.argv
    tmp = tempfile.mkdtemp(prefix="terrace-plan-")
    cases = [("SmolLM2-135M (dense)", model("smollm2"), 2048, 7000, [None, "300M", "200M", "160M"], True)]
    if "--qwen2" in sys.argv:
        cases.append(("Qwen2.5-Coder-0.5B (dense)", model("qwen2"), 4096, 14000,
                      [None, "700M", "560M"], True))
    import synth  # noqa: E402
    moe = os.path.join(tmp, "moe.gguf")
    synth.write("qwen3moe", "Q8_0", moe)
    cases.append(("synthetic qwen3moe (expert cache)", moe, 1024, 900, [None, "64M", "40M", "24M"], False))
    bad = 0
    print("| model | --mem-budget | KV policy | context used | plan (no margin) MiB | peak RSS MiB | RSS / plan |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name, m, ctx, chars, budgets, real in cases:
        pf = os.path.join(tmp, f"p{chars}.txt")
        with open(pf, "w") as f:
            f.write(kjv(chars))
        for b in budgets:
            res, err = run(m, pf, ctx, b)
            if not res:
                print(f"| {name} | {b or 'auto'} | refused: {err[:120]} | | | | |")
                continue
            plan, rss, pol, used = res
            ratio = rss / plan
            off = not 0.9 <= ratio <= 1.1
            bad += off and real
            print(f"| {name} | {b or 'auto (' + 'MemAvailable or cgroup' + ')'} | {pol} | {used}/{ctx} | "
                  f"{plan:.1f} | {rss:.1f} | {ratio:.2f}{' (off)' if off else ''} |", flush=True)
    sys.exit(1 if check and bad else 0)


if __name__ == "__main__":
    main()
