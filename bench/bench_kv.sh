#!/usr/bin/env bash
# KV decode-step speed on a 7B-like attention shape (32 layers, 32 KV heads x 128: 512 KiB of F16
# K+V per token), most of the KV in the cold pool on local disk (O_DIRECT), hot pool 1/16 of the
# KV, alpha 0.2, INT4 scoring copy. Each row runs in its own process inside a memory cgroup (v1,
# page cache counted) capped at what the cache plans to use in DRAM plus 512 MiB, with the page
# cache dropped after the fill; how the pools are filled: bench/bench_kv.c. Needs root.
#
#   bench/bench_kv.sh [SCENARIO ...]            (make bench-kv: main)
#
# Scenarios (each a function below):
#   main       offload, tiered, tiered --kv-tail 4 (default and every unselected token summed) at
#              each of CTXS; batch 8 at BATCH8_CTXS; at the longest context the read-gap choice
#              (0 and 2), keys without runs along positions, reads not pipelined, EXTRA_POLICIES
#   agent      at each context offload, tiered, the storage agent (unthrottled, SmartSSD-like, with
#              --kv-spec) and host scoring that pulls the key copies from storage; BKP off / naive /
#              on for host scoring and the agent at BKP_CTX over BKP_STEPS steps
#   spec       at each context --kv-spec with the agent and on the host, next to the baselines;
#              the agent with --kv-spec at each alpha of SPEC_ALPHAS, host budget of SPEC_HOST_KEYS
#              and --kv-bkp of SPEC_BKP
#   tail-cost  tiered --kv-tail 4 at each --kv-tail-min of TAIL_MINS, and summing 1 in N unselected
#              tokens whatever their share for each N of TAIL_EVERY (the cost at the fractions real
#              models sum; this fill's shares are too peaked to get there)
#   beta       APP: the step at each fixed beta of BETAS (BETA_CTX, the agent SmartSSD-like), with
#              APP's own beta, and with APP's host budget BETA_HOST_KEYS
#   persist    at each context BKP off and on over Q_BKP_STEPS steps for host scoring, the agent
#              and the agent with --kv-spec; then BKP off / naive / on with the agent at BKP_CTX
#   batch      each batch of B16_BATCHES at each of B16_CTXS: offload, host scoring that pulls the
#              keys, tiered, the agent with --kv-spec and BKP (also SmartSSD-like); the agent with
#              --kv-host-keys B16_HOST_KEYS from batch 16 up
#   paired     a speed check of two builds: at PAIRED_CTX, ROUNDS rounds of offload, tiered and
#              the agent with --kv-spec and BKP, each row with KV_BIN and with KV_BIN_REF (e.g. a
#              build of another commit), alternated
#
# Parameters: CTXS="8192 16384 32768" STEPS=3 THREADS=nproc KV_COLD=DIR (default build/bench/kv-cold)
# COLD_LIMIT_GB=40 (skip rows needing more) Q_RHO=0.96 (the queries' step-to-step correlation,
# calibrated so that selections repeat as on real models) SPEC_RHO=0.9 (the speculative query's
# correlation with the real one) KV_BIN (default build/bench/bench_kv; a copy keeps a long run
# safe from a rebuild). Rows go to build/bench/kv-results.jsonl (APPEND=1 keeps the earlier ones);
# the report, with the date, commit, command and machine, to bench/results/kv-<scenarios>.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KV_BIN:-build/bench/bench_kv}
COLD=${KV_COLD:-$PWD/build/bench/kv-cold}
CTXS=${CTXS:-"8192 16384 32768"}
BATCH8_CTXS=${BATCH8_CTXS-"8192"}
EXTRA_POLICIES=${EXTRA_POLICIES-"h2o quest"}
STEPS=${STEPS:-3}
THREADS=${THREADS:-$(nproc)}
COLD_LIMIT_GB=${COLD_LIMIT_GB:-40}
CG=/sys/fs/cgroup/memory/terrace-bench-kv
JSONL=build/bench/kv-results.jsonl
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(main)
for s in "${SCENARIOS[@]}"; do
    case "$s" in
    main | agent | spec | tail-cost | beta | persist | batch | paired) ;;
    *)
        echo "bench-kv: unknown scenario '$s' (main, agent, spec, tail-cost, beta, persist, batch, paired)" >&2
        exit 2
        ;;
    esac
done
NAME=$(IFS=+; echo "${SCENARIOS[*]}")
OUT=bench/results/kv-$NAME.md
[ "$NAME" = main ] && OUT=bench/results/kv-main.md

mkdir -p "$COLD" build/bench bench/results
fstype=$(stat -f -c %T "$COLD")
if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
    echo "bench-kv: $COLD is on $fstype; the cold pool must be on local storage (KV_COLD=DIR)" >&2
    exit 1
fi
if [ ! -d /sys/fs/cgroup/memory ] || ! mkdir -p "$CG" 2>/dev/null; then
    echo "bench-kv: needs the cgroup v1 memory controller at /sys/fs/cgroup/memory (and root)" >&2
    exit 1
fi
echo 0 > "$CG/memory.swappiness" 2>/dev/null || true
drop() { sync; echo 1 > /proc/sys/vm/drop_caches; }
capped() { bash -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' _ "$@"; }

# the device's sequential O_DIRECT read rate, on a 2 GiB file in the cold directory
probe=$COLD/probe.bin
dd if=/dev/zero of="$probe" bs=4M count=512 oflag=direct status=none
drop
dd_out=$(dd if="$probe" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1)
rm -f "$probe"
dd_gbs=$(echo "$dd_out" | awk '{for (i=1;i<=NF;i++) if ($i ~ /[GM]B\/s/) {v=$(i-1); u=$i}} END {if (u=="MB/s") v=v/1000; print v}')
[ "${APPEND:-0}" = 1 ] || : > "$JSONL"
export KV_SCENARIO=""

run() { # label policy ctx batch [extra bench_kv flags...]
    local label=$1 pol=$2 ctx=$3 batch=$4
    shift 4
    local args=(--cold "$COLD" --ctx "$ctx" --batch "$batch" --policy "$pol" --steps "$STEPS"
                --threads "$THREADS" --alpha 0.2 --bits 4 --hot-frac 0.0625 --q-rho "${Q_RHO:-0.96}"
                "$@")
    local plan dram cold_need free_b cap mem_b why=""
    plan=$("$BIN" "${args[@]}" --plan)
    dram=$(echo "$plan" | python3 -c 'import json,sys; print(json.load(sys.stdin)["dram_bytes"])')
    cold_need=$(echo "$plan" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cold_bytes"])')
    free_b=$(df -B1 --output=avail "$COLD" | tail -1)
    cap=$((dram + (512 << 20)))
    mem_b=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) << 10))
    if [ "$cold_need" -gt $((COLD_LIMIT_GB << 30)) ] || [ "$cold_need" -gt $((free_b - (4 << 30))) ]; then
        why="$((cold_need >> 30)) GiB of segment files"
    elif [ "$cap" -gt $((mem_b - (1 << 30))) ]; then
        # a cap above the machine's memory would end in the OOM killer, not in a measurement
        why="$((cap >> 20)) MiB of DRAM planned, the machine has $((mem_b >> 20)) MiB"
    fi
    if [ -n "$why" ]; then
        echo "bench-kv: skip $label ctx $ctx batch $batch: $why" >&2
        echo "{\"label\": \"$label\", \"scenario\": \"$KV_SCENARIO\", \"policy\": \"$pol\", \"ctx\": $ctx, \"batch\": $batch, \"skipped\": \"$why\"}" >> "$JSONL"
        return 0
    fi
    echo "$cap" > "$CG/memory.limit_in_bytes"
    drop
    echo "bench-kv: $label ctx $ctx batch $batch (cap $((cap >> 20)) MiB, $((cold_need >> 30)) GiB on disk)" >&2
    local load0
    load0=$(cut -d' ' -f1 /proc/loadavg)
    if capped "$BIN" "${args[@]}" > build/bench/kv-run.json 2> build/bench/kv-run.err; then
        python3 - "$label" "$cap" "$load0" "$(cut -d' ' -f1 /proc/loadavg)" \
            "$(cat "$CG/memory.max_usage_in_bytes")" build/bench/kv-run.json >> "$JSONL" <<'PY'
import json, os, sys
SCEN = os.environ["KV_SCENARIO"]
for line in open(sys.argv[6]):
    d = json.loads(line)
    d.update(label=sys.argv[1], scenario=SCEN, cap_bytes=int(sys.argv[2]), load_before=float(sys.argv[3]),
             load_after=float(sys.argv[4]), max_usage_bytes=int(sys.argv[5]))
    print(json.dumps(d))
PY
        tail -n "$(wc -l < build/bench/kv-run.json)" "$JSONL" >&2
    else
        echo "bench-kv: $label ctx $ctx batch $batch failed:" >&2
        tail -3 build/bench/kv-run.err >&2
        echo "{\"label\": \"$label\", \"scenario\": \"$KV_SCENARIO\", \"policy\": \"$pol\", \"ctx\": $ctx, \"batch\": $batch, \"failed\": $(python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()[-300:]))' < build/bench/kv-run.err)}" >> "$JSONL"
    fi
    echo 0 > "$CG/memory.max_usage_in_bytes" 2>/dev/null || true
}

SSD_GBPS=${SSD_GBPS:-2.0}; SSD_GFLOPS=${SSD_GFLOPS:-8}; SSD_LINK=${SSD_LINK:-3.2}
SSD=(--csd --csd-gbps "$SSD_GBPS" --csd-gflops "$SSD_GFLOPS" --csd-link-gbps "$SSD_LINK")
SPEC_RHO=${SPEC_RHO:-0.9}
LAST_CTX=${CTXS##* }

bkp_rows() { # placement off / naive / on, with the agent, and on the host too unless "agent"
    local b
    for b in off naive on; do
        [ "${1:-}" = agent ] ||
            run "tiered, BKP $b" tiered "${BKP_CTX:-8192}" 1 --bkp "$b" --steps "${BKP_STEPS:-48}"
        run "tiered + agent, BKP $b" tiered "${BKP_CTX:-8192}" 1 --bkp "$b" --csd --steps "${BKP_STEPS:-48}"
    done
}

scenario_main() {
    local ctx pol
    for ctx in $CTXS; do
        run offload offload "$ctx" 1
        run tiered tiered "$ctx" 1
        run "tiered + tail 4" tiered "$ctx" 1 --tail 4
        run "tiered + tail 4, all summed" tiered "$ctx" 1 --tail 4 --tail-min 0
    done
    for ctx in $BATCH8_CTXS; do
        run offload offload "$ctx" 8
        run tiered tiered "$ctx" 8
        run "tiered + agent" tiered "$ctx" 8 --csd
    done
    run "tiered, read gap 0 / 2" tiered "$LAST_CTX" 1 --read-gap 0,2
    run "tiered, iid keys" tiered "$LAST_CTX" 1 --smooth 0
    run "tiered, reads not pipelined" tiered "$LAST_CTX" 1 --pipe 1
    for pol in $EXTRA_POLICIES; do run "$pol" "$pol" "$LAST_CTX" 1; done
}

scenario_agent() {
    local ctx
    for ctx in $CTXS; do
        run offload offload "$ctx" 1
        run tiered tiered "$ctx" 1
        run "tiered + agent" tiered "$ctx" 1 --csd
        run "tiered + agent, SmartSSD-like" tiered "$ctx" 1 "${SSD[@]}"
        run "tiered + agent + spec" tiered "$ctx" 1 --csd --spec "$SPEC_RHO"
        run "tiered, keys pulled from storage" tiered "$ctx" 1 --pull-keys
    done
    bkp_rows
}

scenario_spec() {
    local ctx a b h
    for ctx in $CTXS; do
        run offload offload "$ctx" 1
        run tiered tiered "$ctx" 1
        run "tiered + agent" tiered "$ctx" 1 --csd
        run "tiered + agent + spec" tiered "$ctx" 1 --csd --spec "$SPEC_RHO"
        run "tiered + spec" tiered "$ctx" 1 --spec "$SPEC_RHO"
        for a in ${SPEC_ALPHAS:-}; do
            run "tiered + agent + spec, alpha $a" tiered "$ctx" 1 --csd --spec "$SPEC_RHO" --alpha "$a"
        done
        # placement learns from the hits of the steps before: more steps
        for b in ${SPEC_BKP:-}; do
            run "tiered + agent, BKP $b" tiered "$ctx" 1 --csd --bkp "$b" --steps "${SPEC_BKP_STEPS:-24}"
            run "tiered + agent + spec, BKP $b" tiered "$ctx" 1 --csd --spec "$SPEC_RHO" --bkp "$b" \
                --steps "${SPEC_BKP_STEPS:-24}"
        done
        for h in ${SPEC_HOST_KEYS:-}; do
            run "tiered + agent + spec, host keys $h" tiered "$ctx" 1 --csd --spec "$SPEC_RHO" --host-keys "$h"
        done
    done
}

scenario_tail_cost() {
    local ctx tm ev
    for ctx in $CTXS; do
        run offload offload "$ctx" 1
        run tiered tiered "$ctx" 1
        for tm in ${TAIL_MINS-1 0}; do
            run "tiered + tail 4, tail-min $tm" tiered "$ctx" 1 --tail 4 --tail-min "$tm"
        done
        for ev in ${TAIL_EVERY-15 8}; do
            run "tiered + tail 4, 1 in $ev summed (forced)" tiered "$ctx" 1 --tail 4 --tail-every "$ev"
        done
    done
}

scenario_beta() {
    local beta bc=${BETA_CTX:-16384}
    for beta in ${BETAS:-0 0.5 1 1.5 2 2.5 3 4 6}; do
        run "beta sweep, beta $beta" tiered "$bc" 1 "${SSD[@]}" --beta "$beta"
    done
    run "beta sweep, beta from APP" tiered "$bc" 1 "${SSD[@]}" --steps 8
    run "beta sweep, beta from APP, host keys ${BETA_HOST_KEYS:-1024}" tiered "$bc" 1 \
        "${SSD[@]}" --steps 8 --host-keys "${BETA_HOST_KEYS:-1024}"
}

scenario_persist() {
    local ctx b qs=${Q_BKP_STEPS:-24}
    for ctx in $CTXS; do
        run offload offload "$ctx" 1
        run tiered tiered "$ctx" 1
        for b in off on; do
            run "tiered, BKP $b" tiered "$ctx" 1 --bkp "$b" --steps "$qs"
            run "tiered + agent, BKP $b" tiered "$ctx" 1 --csd --bkp "$b" --steps "$qs"
            run "tiered + agent + spec, BKP $b" tiered "$ctx" 1 --csd --spec "$SPEC_RHO" --bkp "$b" --steps "$qs"
        done
    done
    bkp_rows agent
}

scenario_batch() {
    local hk ctx b
    for b in ${B16_BATCHES:-8 16}; do
        # from batch 16 the host's and the agents' key copies do not both fit in 24 GiB at 8K
        hk=()
        [ -n "${B16_HOST_KEYS:-1024}" ] && [ "$b" -ge 16 ] && hk=(--host-keys "${B16_HOST_KEYS:-1024}")
        for ctx in ${B16_CTXS:-8192}; do
            run offload offload "$ctx" "$b"
            run "tiered, keys pulled from storage" tiered "$ctx" "$b" --pull-keys
            run tiered tiered "$ctx" "$b"
            run "tiered + agent + spec, BKP on${hk:+, host keys ${hk[1]}}" tiered "$ctx" "$b" \
                --csd --spec "$SPEC_RHO" --bkp on "${hk[@]}"
            run "tiered + agent + spec, BKP on, SmartSSD-like${hk:+, host keys ${hk[1]}}" \
                tiered "$ctx" "$b" "${SSD[@]}" --spec "$SPEC_RHO" --bkp on "${hk[@]}"
        done
    done
}

scenario_paired() {
    local ref=${KV_BIN_REF:?paired: KV_BIN_REF=the other build\'s bench_kv}
    local ctx=${PAIRED_CTX:-32768} r which
    local main_bin=$BIN
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for which in main ref; do
            BIN=$main_bin
            [ "$which" = ref ] && BIN=$ref
            run "offload [$which]" offload "$ctx" 1
            run "tiered [$which]" tiered "$ctx" 1
            run "tiered + agent + spec, BKP on [$which]" tiered "$ctx" 1 --csd --spec "$SPEC_RHO" \
                --bkp on --steps "${PAIRED_STEPS:-12}"
        done
    done
    BIN=$main_bin
}

for s in "${SCENARIOS[@]}"; do
    KV_SCENARIO=$s
    "scenario_${s//-/_}"
done
rmdir "$CG" 2>/dev/null || true

python3 - "$JSONL" "$OUT" "$dd_gbs" "$THREADS" "$STEPS" "bench/bench_kv.sh ${SCENARIOS[*]}" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with changes)')" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out, dd_gbs, threads, steps, cmd, commit, cpu = sys.argv[2:9]
def g(x): return x / 2**30
L = [f"# KV decode step: `{cmd}`\n",
     f"Run {datetime.date.today()} at commit {commit}: {cpu}, {threads} threads, local disk "
     f"(sequential O_DIRECT read by dd: {dd_gbs} GB/s), {steps} timed decode steps per row after "
     "one warm-up step (rows that need more history name their own). Shape and fill: "
     "bench/bench_kv.c; the scenarios: bench/bench_kv.sh. Each row is its own process in a "
     "memory cgroup capped at its planned DRAM + 512 MiB (page cache counted), caches dropped "
     "after the fill; the load average before/after each row is in the last column.\n",
     "Per decode step (all 32 layers, every sequence of the batch): wall time (mean, min), what "
     "the cache read from storage and in how many reads, tokens attended (summed over layers and "
     "sequences), selection time, time waiting for reads, the process's CPU time, planned DRAM "
     "and the cgroup's peak. \"vs\" columns: against the offload and tiered rows of the same "
     "scenario, context and batch measured last before the row. Agent → host: score blocks + K/V "
     "rows; the bound is alpha x the cold pool's K/V + the score blocks.\n"]
def agent_bytes(d):
    if not d.get("csd"): return "– | – | "
    cold_kv = d["batch"] * d["ctx"] * (1 - 1 / 16) * 32 * 16384
    sc, rw = d.get("csd_score_bytes", 0), d.get("csd_row_bytes", 0)
    return f"{sc / 2**20:.1f} + {rw / 2**20:.1f} | {(d['alpha'] * cold_kv + sc) / 2**20:.0f} | "
for scen in dict.fromkeys(d.get("scenario", "?") for d in rows):
    rs = [d for d in rows if d.get("scenario", "?") == scen]
    L.append(f"## {scen}\n")
    L.append("| run | ctx | batch | steps | step ms (min) | GiB read | reads | vs offload | vs tiered | attended | select ms | I/O wait ms | CPU usr+sys ms | agent->host MiB | bound MiB | hot hit % | repeat % | ping-pong / step | promotions / step | DRAM plan / peak GiB | cold GiB | fill s | load |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    last = {}
    for d in rs:
        lab = d.get("label", d["policy"])
        if "skipped" in d or "failed" in d:
            why = "skipped: " + d["skipped"] if "skipped" in d else "FAILED: " + d["failed"][-120:]
            L.append(f"| {lab} | {d['ctx']} | {d['batch']} | {why} |" + " |" * 19)
            continue
        if d.get("read_gap", 1) != 1 and lab.startswith("tiered, read gap"):
            lab = f"tiered, read gap {d['read_gap']}"
        tag = lab[lab.index(" ["):] if " [" in lab else ""
        o = last.get(("offload" + tag, d["ctx"], d["batch"]))
        t = last.get(("tiered" + tag, d["ctx"], d["batch"]))
        vs = lambda b: f"{b['step_ms'] / d['step_ms']:.2f}x" if b and b is not d else "–"
        L.append(f"| {lab} | {d['ctx']} | {d['batch']} | {d['steps']} | {d['step_ms']:.0f} ({d['step_ms_min']:.0f}) | "
                 f"{g(d['bytes_read']):.2f} | {d['read_ops']:.0f} | {vs(o)} | {vs(t)} | "
                 f"{d['selected']:.0f} | {d['score_ms']:.0f} | {d['io_wait_ms']:.0f} | "
                 f"{d['cpu_user_ms']:.0f}+{d['cpu_sys_ms']:.0f} | " + agent_bytes(d) +
                 f"{100 * d.get('hot_hit_rate', 0):.1f} | {100 * d.get('sel_repeat', 0):.1f} | "
                 f"{d.get('pingpong', 0):.0f} | {d.get('promotions', 0):.0f} | "
                 f"{g(d['dram_bytes']):.2f} / {g(d['max_usage_bytes']):.2f} | {g(d['cold_bytes']):.1f} | "
                 f"{d['fill_s']:.0f} | {d['load_before']:.1f}/{d['load_after']:.1f} |")
        last[(lab, d["ctx"], d["batch"])] = d
    L.append("")
    sw = [d for d in rs if "step_ms" in d and d.get("label", "").startswith("beta sweep")]
    if sw:
        L.append("APP: beta = tokens scored by the host / by the agent among those on storage; split "
                 "= the beta in effect once the host's budget (the positions it keeps keys for) caps "
                 "it; rates: host and agent scoring (f_c, f_s), hot-pool copies and agent rows "
                 "(B_c, B_s).\n")
        L.append("| beta | split | step ms (min) | f_c M tok/s | f_s M tok/s | B_c GB/s | B_s GB/s | DRAM GiB |")
        L.append("|---|---|---|---|---|---|---|---|")
        for d in sw:
            auto = d.get("beta_set", -1) < 0
            hk = f" (M_0 {d['host_keys']})" if d.get("host_keys") else ""
            L.append(f"| {'APP' + hk + ': ' if auto else ''}{d['beta']:.4g} | {d.get('beta_split', d['beta']):.3f} | "
                     f"{d['step_ms']:.0f} ({d['step_ms_min']:.0f}) | {d['f_c'] / 1e6:.2f} | "
                     f"{d['f_s'] / 1e6:.2f} | {d['b_c'] / 1e9:.1f} | {d['b_s'] / 1e9:.2f} | "
                     f"{d['dram_bytes'] / 2**30:.2f} |")
        L.append("")
    pr = [d for d in rs if "step_ms" in d and (d.get("label", "").endswith("[main]") or d.get("label", "").endswith("[ref]"))]
    if pr:
        L.append("Paired: each configuration's mean over the rounds, this build [main] against the "
                 "other [ref], and the spread (lowest and highest round).\n")
        L.append("| configuration | main ms | ref ms | main / ref | main rounds | ref rounds |")
        L.append("|---|---|---|---|---|---|")
        for base in dict.fromkeys(d["label"].rsplit(" [", 1)[0] for d in pr):
            m = [d["step_ms"] for d in pr if d["label"] == base + " [main]"]
            r = [d["step_ms"] for d in pr if d["label"] == base + " [ref]"]
            if not m or not r: continue
            mm, rm = sum(m) / len(m), sum(r) / len(r)
            L.append(f"| {base} | {mm:.0f} | {rm:.0f} | {mm / rm:.3f} | {min(m):.0f}–{max(m):.0f} | {min(r):.0f}–{max(r):.0f} |")
        L.append("")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
echo "bench-kv: report in $OUT, rows in $JSONL" >&2
if [ -x .venv/bin/python3 ] && .venv/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    .venv/bin/python3 bench/plot_kv.py "$JSONL" bench/results
else
    echo "bench-kv: no matplotlib in .venv: plots skipped (make bench-kv installs it)" >&2
fi
