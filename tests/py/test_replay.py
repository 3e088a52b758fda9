#!/usr/bin/env python3
"""`terrace replay` on the shared Qwen3-30B-A3B route trace against the curve BigMoeOnEdge
published for it: Belady and LRU must reproduce the published decode-only hit % within 0.5 points
at every budget (that pins down the replay semantics); the online policies are printed next to
them, and the properties the expert cache relies on are checked: "auto" is within 0.5 points of
the better of LRU and LFU (or above) at every budget, and below one token's working set LRU
collapses while "auto" does not. The shared trace's train/test split (its first and second half
of decode tokens) is printed with the share of the LRU -> Belady gap each policy closes.

With RECORDER (a release build of terrace: recording runs the model), the same floor is checked
on traces the policies were not developed on: recorded from the structured-router synthetic
model of every MoE architecture, and four that invert the shared trace's statistics
(route_traces.py), at the budgets of the shared trace's curve relative to one token's working set
(250..8000 MiB = 0.32..10.2 T), up to what holds every expert; the cells in KNOWN_SHORT, where
the floor is known not to hold, are held to their recorded margin instead.

usage: test_replay.py TERRACE TRACE CURVE [RECORDER]

Prints SKIPPED (exit 0) when the trace or the curve is absent, unless CI=true (then it fails).
Stdlib only, apart from the model writer route_traces.py runs (the venv's gguf and numpy).
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

TOL = 0.5  # points
# Generated-trace cells where the default is known to miss the floor (the goal is not met there):
# (trace, budget / T rounded to 0.01) -> the least margin over max(LRU, LFU) still accepted, so
# they cannot get worse unnoticed (the replays are machine-independent). None at present: every
# cell meets the floor. A cell listed here that reaches the floor is reported, so the entry can go.
KNOWN_SHORT = {}
HERE = os.path.dirname(os.path.abspath(__file__))
CURVE_MIB = [250, 500, 750, 1000, 1500, 2000, 2500, 3000, 4000, 6000, 8000]
SHARED_T_MIB = 785  # the shared trace's working set: the curve's budgets relative to it


def replay(terrace, trace, budgets, policies, extra=()):
    cmd = [terrace, "replay", trace, "--json", "--budget", ",".join(budgets),
           "--policies", ",".join(policies)] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def generated_floor(terrace, recorder, shared, failures):
    """adaptive (= auto) >= max(lru, lfu) - TOL on every generated trace and budget"""
    with tempfile.TemporaryDirectory(prefix="terrace-routes.") as tmp:
        t0 = time.time()
        py = sys.executable
        for args in (["record", recorder, tmp], ["invert", shared, tmp]):
            r = subprocess.run([py, os.path.join(HERE, "route_traces.py")] + args,
                               capture_output=True, text=True)
            if r.returncode != 0:
                failures.append(f"route_traces.py {args[0]}: {r.stdout}{r.stderr}")
                return
        print(f"\ngenerated traces recorded and inverted in {time.time() - t0:.1f} s")
        worst, short, seen_known = [], [], set()
        for name in sorted(os.listdir(tmp)):
            if not name.endswith(".route.csv"):
                continue
            path = os.path.join(tmp, name)
            info = replay(terrace, path, ["1000"], ["lru"])
            ws = info["working_set_bytes"]
            every = info["n_moe_layers"] * info["n_expert"] * info["expert_bytes_max"]
            least = info["expert_bytes_max"] * info["n_expert_used"]
            budgets = [int(m / SHARED_T_MIB * ws) for m in CURVE_MIB]
            budgets = [b for b in budgets if least <= b < 0.97 * every]
            d = replay(terrace, path, ["%dB" % b for b in budgets], ["lru", "lfu", "auto"])
            cells = []
            for row in d["budgets"]:
                h = row["decode_hit_pct"]
                floor = max(h["lru"], h["lfu"])
                t = row["budget_bytes"] / ws
                worst.append((h["auto"] - floor, name, t))
                cells.append(f"{t:.2f}T {h['auto']:.1f}/{floor:.1f}")
                known = KNOWN_SHORT.get((name, round(t, 2)))
                if known is not None:
                    seen_known.add((name, round(t, 2)))
                    margin = h["auto"] - floor
                    if margin < known:
                        failures.append(f"{name} at {t:.2f} T: auto {h['auto']:.2f}, "
                                        f"{margin:+.2f} from max(lru, lfu) {floor:.2f}: worse "
                                        f"than the known shortfall's bound {known:+.2f}")
                    elif margin < -TOL:
                        short.append(f"{name} at {t:.2f} T {margin:+.2f}")
                    else:
                        print(f"  {name} at {t:.2f} T now meets the floor ({margin:+.2f}): "
                              "drop it from KNOWN_SHORT")
                elif h["auto"] + TOL < floor:
                    failures.append(f"{name} at {t:.2f} T: auto "
                                    f"{h['auto']:.2f} < max(lru, lfu) {floor:.2f} - {TOL}")
            print(f"  {name}: auto/max(lru,lfu) " + "  ".join(cells))
        for k in KNOWN_SHORT:
            if k not in seen_known:
                failures.append(f"known shortfall {k[0]} at {k[1]:.2f} T: no such cell replayed")
        if short:
            print("  BELOW THE FLOOR (known shortfalls, the goal is not met there): "
                  + ", ".join(short))
        worst.sort()
        print("  closest to the floor: " + ", ".join(
            f"{n} at {t:.2f} T {w:+.2f}" for w, n, t in worst[:3]))


def parse_curve(path):
    """-> (column names, {budget_mib: {policy: hit%}}) from the published text table"""
    cols, rows = None, {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if not p:
                continue
            if p[0] == "budget":
                cols = p[1:]
                continue
            if cols and p[0].replace(".", "", 1).isdigit() and len(p) == len(cols) + 1:
                rows[float(p[0])] = {c: float(v) for c, v in zip(cols, p[1:])}
    if not cols or not rows:
        raise SystemExit(f"FAIL: no table found in {path}")
    return cols, rows


def main():
    if len(sys.argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    terrace, trace, curve = sys.argv[1:4]
    recorder = sys.argv[4] if len(sys.argv) > 4 else None
    missing = [p for p in (trace, curve) if not os.path.exists(p)]
    if missing:
        if os.environ.get("CI") == "true":
            print(f"FAIL: {', '.join(missing)} missing and CI=true")
            return 1
        print(f"SKIPPED: {', '.join(missing)} not found")
        return 0

    cols, pub = parse_curve(curve)
    budgets = sorted(pub)
    online = ["lrfu", "layered", "knn", "adaptive", "auto"]
    policies = ["belady", "lru", "lfu", "random"] + online
    cmd = [terrace, "replay", trace, "--json",
           "--budget", ",".join("%g" % b for b in budgets), "--policies", ",".join(policies)]
    # the replay's CPU time, not the wall clock: on a loaded machine (2 cores shared by a whole
    # test run) the wall clock measures the load
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    dt = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    if r.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
        return 1
    doc = json.loads(r.stdout)
    ours = {row["budget_mib"]: row["decode_hit_pct"] for row in doc["budgets"]}
    ws = doc["working_set_mib"]

    failures = []
    print(f"{os.path.basename(trace)}: {doc['decode_lookups']} decode lookups, T = {ws:.0f} MiB, "
          f"{len(budgets)} budgets x {len(policies)} policies replayed in {dt:.2f} s of CPU")
    print()
    hdr = f"{'budget':>7} | {'belady':>13} | {'lru':>13} | {'lfu':>13} | {'random':>13} |"
    hdr += "".join(f" {p:>8}" for p in online)
    print(hdr)
    print(f"{'(MiB)':>7} | {'ours  publ.':>13} | {'ours  publ.':>13} | {'ours  publ.':>13} | "
          f"{'ours  publ.':>13} |" + "".join(f" {'ours':>8}" for _ in online))
    for b in budgets:
        o, p = ours[b], pub[b]
        line = f"{b:7.0f} |"
        for pol in ("belady", "lru", "lfu", "random"):
            line += f" {o[pol]:5.1f} {p[pol]:5.1f}  |" if pol in p else f" {o[pol]:5.1f}   -    |"
        line += "".join(f" {o[x]:8.1f}" for x in online)
        print(line + ("   <T" if b < ws else ""))
        for pol in ("belady", "lru"):
            if pol not in p:
                failures.append(f"the published curve has no {pol} column")
            elif abs(o[pol] - p[pol]) > TOL:
                failures.append(f"{pol} at {b:g} MiB: {o[pol]:.2f} vs published {p[pol]:.1f} "
                                f"(more than {TOL} points apart)")
        # the policy the live cache runs by default must not lose to the simple ones
        floor = max(o["lru"], o["lfu"])
        if o["auto"] + TOL < floor:
            failures.append(f"auto at {b:g} MiB: {o['auto']:.2f} < max(lru, lfu) {floor:.2f} - "
                            f"{TOL}")
        if o["auto"] != o["adaptive"]:
            failures.append(f"auto at {b:g} MiB ({o['auto']}) is not adaptive ({o['adaptive']})")
        if b < ws:
            if o["lru"] > 1.0:
                failures.append(f"LRU below the cliff ({b:g} MiB) hit {o['lru']:.1f}%: no cliff?")
            if o["auto"] <= o["lfu"]:
                failures.append(f"auto below the cliff ({b:g} MiB) is not above LFU")

    # the train/test split: the first half of the decode tokens (the policies were developed
    # looking at it) and the second (judged with the cache the first half left)
    n_tok = doc["decode_tokens"]
    half = n_tok // 2
    print(f"\ntrain/test split of the {n_tok} decode tokens: 0..{half - 1} / {half}..{n_tok - 1}")
    for label, window in (("train", f"0:{half}"), ("test", f"{half}:")):
        d = replay(terrace, trace, ["1000", "2000", "3000"],
                   ["belady", "lru", "lfu", "layered", "knn", "adaptive"], ["--tokens", window])
        closed = []
        for row in d["budgets"]:
            h = row["decode_hit_pct"]
            gap = h["belady"] - h["lru"]
            c = {p: (h[p] - h["lru"]) / gap if gap > 0 else float("nan")
                 for p in ("layered", "knn", "adaptive")}
            closed.append(c["adaptive"])
            print(f"  {label} {row['budget_mib']:.0f} MiB: belady {h['belady']:.1f} lru "
                  f"{h['lru']:.1f} lfu {h['lfu']:.1f} layered {h['layered']:.1f} knn "
                  f"{h['knn']:.1f} adaptive {h['adaptive']:.1f}; gap closed: layered "
                  f"{100 * c['layered']:.0f}%, knn {100 * c['knn']:.0f}%, adaptive "
                  f"{100 * c['adaptive']:.0f}%")
        print(f"  {label}: adaptive closes {100 * sum(closed) / len(closed):.1f}% of the gap on "
              "average over 1000/2000/3000 MiB (the goal: 40% on the test half)")
    if recorder:
        generated_floor(terrace, recorder, trace, failures)

    print()
    for b in (1000, 2000, 3000):
        if b in ours:
            o = ours[b]
            best = max(online[:-1], key=lambda x: o[x])
            gap = o["belady"] - o["lru"]
            closed = (o[best] - o["lru"]) / gap if gap > 0 else float("nan")
            print(f"  {b} MiB: best online {best} {o[best]:.1f}%, lru {o['lru']:.1f}%, belady "
                  f"{o['belady']:.1f}%: closes {100 * closed:.0f}% of the LRU->Belady gap")
    # --prefetch (co-activation read-ahead, an experiment): the accounting holds together and the
    # counts learned online predict something on a real trace (more hits than without)
    pcmd = [terrace, "replay", trace, "--json", "--budget", "1000,2000", "--policies",
            "lru,layered", "--prefetch", "4"]
    r = subprocess.run(pcmd, capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{' '.join(pcmd)} exited {r.returncode}: {r.stderr.strip()}")
    else:
        pd = json.loads(r.stdout)
        if pd.get("prefetch") != 4:
            failures.append("--prefetch 4: the JSON does not say prefetch 4")
        for row in pd["budgets"]:
            bm = row["budget_mib"]
            for pol, d in row["detail"].items():
                if not (0 < d["prefetch_used"] <= d["prefetch_reads"]):
                    failures.append(f"prefetch {pol} at {bm:g}: used {d['prefetch_used']} of "
                                    f"{d['prefetch_reads']} reads")
                if d["decode_read_bytes"] < d["prefetch_bytes"] or d["prefetch_bytes"] <= 0:
                    failures.append(f"prefetch {pol} at {bm:g}: bytes do not add up")
            hp = row["decode_hit_pct"]["layered"]
            print(f"  --prefetch 4 at {bm:g} MiB: layered {hp:.1f}% (without: "
                  f"{ours[bm]['layered']:.1f}%), "
                  f"{row['detail']['layered']['decode_read_bytes'] / 2**30:.1f} GiB read")
            if bm in ours and hp <= ours[bm]["layered"]:
                failures.append(f"prefetch at {bm:g}: layered {hp:.1f}% not above "
                                f"{ours[bm]['layered']:.1f}% without it")
    if dt > 30:
        failures.append(f"replay took {dt:.1f} s of CPU (should be seconds)")
    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print(f"\nbelady and lru within {TOL} points of the published curve at all {len(budgets)} "
          f"budgets; auto >= max(lru, lfu) - {TOL} on the shared trace"
          + (f" and on the generated traces except the {len(KNOWN_SHORT)} known shortfalls "
             "(within their bounds)" if recorder else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
