#!/usr/bin/env python3
"""Plots of `make bench-kv` (bench/bench_kv.sh) from build/bench/kv-results.jsonl:

  bench/results/kv-steps.png  decode-step time against context, batch 1, for offload, host scoring
                              pulling the keys from storage, tiered (host scoring from DRAM), and
                              tiered with the storage agent (unthrottled and SmartSSD-like), and
                              the agent with the next layer selected and read ahead (--kv-spec)
  bench/results/kv-beta.png   step time against the host / agent split of the scoring (beta once
                              the host budget caps it) with APP's marked

usage: plot_kv.py [RESULTS.jsonl] [OUTDIR]     (needs matplotlib)
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bench", "kv-results.jsonl")
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "bench", "results")
rows = [json.loads(line) for line in open(src) if line.strip()]
rows = [d for d in rows if "step_ms" in d]

def finish(fig, ax, xlabel, ylabel, title, name):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    print("wrote", path)


# the last measurement of each (label, ctx) at batch 1: rows re-measured later replace earlier ones
last = {}
for d in rows:
    if d["batch"] == 1:
        last[(d.get("label", d["policy"]), d["ctx"])] = d

series = [("offload", "offload (reads all KV)", "tab:red", "o"),
          ("tiered, keys pulled from storage", "host scoring, keys pulled from storage",
           "tab:orange", "v"),
          ("tiered", "tiered, host scoring (key copy in DRAM)", "tab:blue", "s"),
          ("tiered + agent", "tiered + storage agent", "tab:green", "^"),
          ("tiered + agent, SmartSSD-like", "tiered + agent, SmartSSD-like", "tab:olive", "D"),
          ("tiered + agent + spec", "tiered + agent, next layer read ahead (--kv-spec)",
           "tab:purple", "*")]
# a scenario without these rows (the paired check, the beta sweep alone) leaves the plot as it is
if any(l == lab for lab, *_ in series for (l, _c) in last):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for lab, name, color, mk in series:
        pts = sorted((ctx, d["step_ms"]) for (l, ctx), d in last.items() if l == lab)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=mk, color=color, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({c for (_, c) in last}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{int(v) // 1024}K"))
    finish(fig, ax, "context (tokens)", "decode step, ms (32 layers)",
           "KV decode step, 7B-like attention, most KV on disk (alpha 0.2)", "kv-steps.png")

sw = [d for d in rows if d.get("label", "").startswith("beta sweep")]
# the split used: beta once the host's share is capped by its budget, the positions it keeps keys
# for (rows without beta_split: the beta asked for)
split = lambda d: d.get("beta_split", d["beta"])
# each beta's mean over the passes that measured it
by_b = {}
for d in sw:
    if d.get("beta_set", -1) >= 0: by_b.setdefault(d["beta_set"], []).append(d)
fixed = sorted((split(ds[-1]), sum(d["step_ms"] for d in ds) / len(ds), ds[-1]["beta"])
               for ds in by_b.values())
# APP with the host keeping every key (a row with --host-keys shows its budget capping the split)
auto = [d for d in sw if d.get("beta_set", -1) < 0 and not d.get("host_keys")]
if fixed:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([x for x, _, _ in fixed], [ms for _, ms, _ in fixed], marker="o", color="tab:blue",
            label="fixed beta (--kv-beta), at the split it gives")
    if auto:
        am = sum(d["step_ms"] for d in auto) / len(auto)
        asp = sum(split(d) for d in auto) / len(auto)
        ax.axvline(asp, color="tab:green", ls="--",
                   label=f"APP: split {asp:.2f} (mean of {len(auto)}; {am:.0f} ms)")
        ax.plot([asp], [am], marker="*", ms=14, color="tab:green")
    best = min(fixed, key=lambda x: x[1])
    ax.plot([best[0]], [best[1]], marker="o", ms=12, mfc="none", color="tab:red",
            label=f"sweep minimum: beta {best[2]:g}, split {best[0]:.3f} ({best[1]:.0f} ms)")
    finish(fig, ax, "split = host / agent tokens on storage (beta in effect)",
           "decode step, ms",
           f"APP: step time against the split, {sw[0]['ctx'] // 1024}K, agent SmartSSD-like",
           "kv-beta.png")
