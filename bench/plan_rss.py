#!/usr/bin/env python3
"""The memory plan against the peak RSS measured (make bench-plan; results in
bench/results/long.md).

For a dense model (SmolLM2-135M, real), a synthetic MoE model through the expert cache and,
given --qwen2, Qwen2.5-Coder-0.5B: `terrace run` under several --mem-budget values (and the
automatic cap), and for the real models offload and tiered + the storage agent (--csd) with a
small hot pool and a cold pool, with a prompt that fills most of the context (RSS counts the KV
pages written, not those planned), 8 tokens generated. Each row is the plan's total without its
margin for this process (weights + expert cache + KV + scratch + the process's own pages as
loading began: code, libraries, stacks), the peak RSS the run measured (VmHWM) and their ratio;
a row outside 0.90..1.10 is marked. With the agent, its own plan and its peak RSS (VmHWM of its
process: its own pages and the shared region's pages it touched) are a column of their own: the
host's VmHWM does not hold them.

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
    xdg = tempfile.mkdtemp(prefix="terrace-plan-")
    env = dict(os.environ, XDG_CACHE_HOME=xdg)
    args = [a.replace("COLD", xdg) for a in args]
    r = subprocess.run(args, capture_output=True, text=True, env=env, errors="replace")
    if r.returncode:
        return None, r.stderr.strip().splitlines()[-1]
    g = re.search(r"plan without the margin ([\d.]+) MiB, peak RSS ([\d.]+) MiB", r.stderr)
    pol = re.search(r"\+ KV [\d.]+ MiB \((\w+)\)", r.stderr)
    ctxu = re.search(r"context (\d+)/(\d+)", r.stderr)
    ag = re.search(r"storage agent \(pid \d+, its own process\): plan ([\d.]+) MiB of its own, "
                   r"peak RSS ([\d.]+) MiB", r.stderr)
    agent = (float(ag.group(1)), float(ag.group(2))) if ag else None
    return (float(g.group(1)), float(g.group(2)), pol.group(1), ctxu.group(1), agent), None


def main():
    check = "--check" in sys.argv
    tmp = tempfile.mkdtemp(prefix="terrace-plan-")
    # a budget, or (label, flags): offload and tiered + the agent with a hot pool far below the
    # KV, the rest in a cold pool (COLD: the run's own directory)
    pooled = [("offload, 4M hot", ["--kv-policy", "offload", "--kv-hot", "4M", "--kv-cold", "COLD"]),
              ("tiered + agent, 4M hot", ["--kv-policy", "tiered", "--kv-hot", "4M", "--kv-cold",
                                          "COLD", "--csd"])]
    cases = [("SmolLM2-135M (dense)", model("smollm2"), 2048, 7000,
              [None, "300M", "200M", "160M", *pooled], True)]
    if "--qwen2" in sys.argv:
        cases.append(("Qwen2.5-Coder-0.5B (dense)", model("qwen2"), 4096, 14000,
                      [None, "700M", "560M", *pooled], True))
    import synth  # noqa: E402
    moe = os.path.join(tmp, "moe.gguf")
    synth.write("qwen3moe", "Q8_0", moe)
    cases.append(("synthetic qwen3moe (expert cache)", moe, 1024, 900, [None, "64M", "40M", "24M"], False))
    bad = 0
    print("| model | --mem-budget or flags | KV policy | context used | plan (no margin) MiB | peak RSS MiB "
          "| RSS / plan | the agent's own: plan / peak RSS MiB |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name, m, ctx, chars, budgets, real in cases:
        pf = os.path.join(tmp, f"p{chars}.txt")
        with open(pf, "w") as f:
            f.write(kjv(chars))
        for b in budgets:
            label, budget, extra = (b[0], None, b[1]) if isinstance(b, tuple) else (b, b, [])
            res, err = run(m, pf, ctx, budget, extra)
            if not res:
                print(f"| {name} | {label or 'auto'} | refused: {err[:120]} | | | | | |")
                continue
            plan, rss, pol, used, agent = res
            ratio = rss / plan
            off = not 0.9 <= ratio <= 1.1
            bad += off and real
            ag = f"{agent[0]:.1f} / {agent[1]:.1f}" if agent else "—"
            print(f"| {name} | {label or 'auto (' + 'MemAvailable or cgroup' + ')'} | {pol} | {used}/{ctx} | "
                  f"{plan:.1f} | {rss:.1f} | {ratio:.2f}{' (off)' if off else ''} | {ag} |", flush=True)
    sys.exit(1 if check and bad else 0)


if __name__ == "__main__":
    main()
