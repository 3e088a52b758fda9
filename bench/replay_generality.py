#!/usr/bin/env python3
"""Expert-cache policies beyond the trace they were developed on (make bench-replay).

  [REUSE=1] replay_generality.py TERRACE SHARED_TRACE [OUTDIR]

Prints markdown for bench/results/replay.md:
  1. the shared Qwen3-30B-A3B trace, every policy at the published budgets
  2. its train/test split: the first half of the decode tokens (looked at while developing) and
     the second (judged with the cache the first half left), LRU -> Belady gap closed
  3. traces recorded from the structured-router synthetic models of every MoE architecture and
     traces inverting the shared one's statistics (tests/py/route_traces.py), at the shared
     curve's budgets relative to one token's working set (250..8000 MiB = 0.32..10.2 T)
Every figure is decode hit % from `terrace replay`; the margin column is the default's hit rate
less the better of LRU and LFU. Needs the venv (the model writer) and a release build.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CURVE_MIB = [250, 500, 750, 1000, 1500, 2000, 2500, 3000, 4000, 6000, 8000]
SHARED_T_MIB = 785
POLICIES = ["belady", "lru", "lfu", "random", "lrfu", "layered", "knn", "adaptive"]


def replay(terrace, trace, budgets, policies, extra=()):
    cmd = [terrace, "replay", trace, "--json", "--budget", ",".join(budgets),
           "--policies", ",".join(policies)] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def table(d, policies, ws, rel):
    head = "| budget | " + " | ".join(policies) + " | adaptive − max(lru, lfu) | gap closed |"
    out = [head, "|---:|" + "---:|" * (len(policies) + 2)]
    worst = 99
    for row in d["budgets"]:
        h = row["decode_hit_pct"]
        m = h["adaptive"] - max(h["lru"], h["lfu"])
        worst = min(worst, m)
        b = f"{row['budget_bytes'] / ws:.2f} T" if rel else f"{row['budget_mib']:.0f} MiB"
        cells = []
        for p in policies:
            best_online = max(h[q] for q in policies if q not in ("belady",))
            v = f"{h[p]:.1f}"
            cells.append(f"**{v}**" if p != "belady" and h[p] == best_online else v)
        gap = h["belady"] - h["lru"]
        closed = f"{100 * (h['adaptive'] - h['lru']) / gap:.0f} %" if gap > 0.05 else "–"
        out.append(f"| {b} | " + " | ".join(cells) + f" | {m:+.1f} | {closed} |")
    return "\n".join(out), worst


def main():
    terrace, shared = sys.argv[1], sys.argv[2]
    outdir = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="terrace-routes.")
    d = replay(terrace, shared, [str(m) for m in CURVE_MIB], POLICIES)
    ws = d["working_set_bytes"]
    print("### The shared trace\n")
    t, w = table(d, POLICIES, ws, False)
    print(t)
    print(f"\nLowest margin of adaptive over max(lru, lfu): {w:+.1f} points.\n")
    print("### Train / test split of the shared trace\n")
    n = d["decode_tokens"]
    half = n // 2
    print(f"The trace has one turn, so it is split by decode tokens: train = tokens 0..{half - 1}, "
          f"test = {half}..{n - 1} (hits counted only there; the cache enters the test half as the "
          "train half left it). Gap closed = (policy − LRU) / (Belady − LRU).\n")
    print("| split | budget MiB | belady | lru | lfu | layered | knn | adaptive | gap closed: layered / knn / adaptive |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, win in (("train", f"0:{half}"), ("test", f"{half}:")):
        ds = replay(terrace, shared, ["1000", "2000", "3000"],
                    ["belady", "lru", "lfu", "layered", "knn", "adaptive"], ["--tokens", win])
        cl = {p: [] for p in ("layered", "knn", "adaptive")}
        for row in ds["budgets"]:
            h = row["decode_hit_pct"]
            gap = h["belady"] - h["lru"]
            for p in cl:
                cl[p].append(100 * (h[p] - h["lru"]) / gap)
            print(f"| {label} | {row['budget_mib']:.0f} | {h['belady']:.1f} | {h['lru']:.1f} | {h['lfu']:.1f} | "
                  f"{h['layered']:.1f} | {h['knn']:.1f} | {h['adaptive']:.1f} | "
                  + " / ".join(f"{cl[p][-1]:.0f}%" for p in cl) + " |")
        print(f"| {label} mean | | | | | | | | " + " / ".join(f"**{sum(v) / len(v):.1f}%**" for v in cl.values()) + " |")
    print()
    py = os.path.join(ROOT, ".venv", "bin", "python3")
    gen = os.path.join(ROOT, "tests", "py", "route_traces.py")
    # REUSE=1 with an OUTDIR of an earlier run: replay its traces instead of recording them again
    if not os.environ.get("REUSE"):
        subprocess.run([py, gen, "record", terrace, outdir], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([py, gen, "invert", shared, outdir], check=True, stdout=subprocess.DEVNULL)
    print("### Traces the policies were not developed on\n")
    worst = []
    for name in sorted(os.listdir(outdir)):
        if not name.endswith(".route.csv"):
            continue
        path = os.path.join(outdir, name)
        info = replay(terrace, path, ["1000"], ["lru"])
        ws = info["working_set_bytes"]
        every = info["n_moe_layers"] * info["n_expert"] * info["expert_bytes_max"]
        least = info["expert_bytes_max"] * info["n_expert_used"]
        budgets = [int(m / SHARED_T_MIB * ws) for m in CURVE_MIB]
        budgets = [b for b in budgets if least <= b < 0.97 * every]
        dg = replay(terrace, path, ["%dB" % b for b in budgets], POLICIES)
        print(f"**{name[:-len('.route.csv')]}** ({info['arch']}, {info['n_layer']} layers, "
              f"{info['n_expert']} experts, top-{info['n_expert_used']}, {info['decode_tokens']} decode "
              f"tokens; T = {ws / 2**20:.2f} MiB)\n")
        t, w = table(dg, POLICIES, ws, True)
        print(t + "\n")
        worst.append((w, name))
    worst.sort()
    print("Lowest margin per trace: " + ", ".join(f"{n[:-10]} {w:+.1f}" for w, n in worst) + "\n")


if __name__ == "__main__":
    main()
