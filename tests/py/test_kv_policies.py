#!/usr/bin/env python3
"""With --kv-alpha 1 every KV policy must give the logits of the full cache (within float
tolerance), on synthetic models of each attention shape — MHA (olmoe: 4 heads, 4 KV heads), GQA
(qwen2: 4 / 2), MQA (gemma3: 4 / 1, with sliding-window layers) — all tokens hot, and with most
tokens in the cold pool on disk; and on the default real model. At alpha < 1 the policies must
still run and stay close (reported, not asserted: that is the quality benchmark's job).

usage: test_kv_policies.py TERRACE [DEFAULT_MODEL.gguf]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import synth  # noqa: E402

TERRACE = sys.argv[1]
REAL = sys.argv[2] if len(sys.argv) > 2 else None
POLICIES = ["offload", "h2o", "quest", "tiered"]
# Same F16 K/V, same F16 rounding of q and of the probabilities; what differs is float summation
# order (the managed path accumulates V row by row instead of position-dot-products) and, through
# the F16 roundings, occasional one-ulp flips: ~1e-3 on logits of spread ~20 (parity.py measures
# the same effect against llama.cpp). A policy that drops or misweights a token moves logits by
# >= 0.1.
TOL = 2e-2
from tally import check, verdict  # noqa: E402


def logits(model, toks, extra, out, env=None):
    r = subprocess.run([TERRACE, "logits", "-m", model, "--tokens", ",".join(map(str, toks)),
                        "--out", out, "-b", "64", *extra], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return np.fromfile(out, dtype=np.float32).reshape(len(toks), -1), ""


def main():
    with tempfile.TemporaryDirectory(prefix="terrace-kv-") as tmp:
        cold = os.path.join(tmp, "cold")
        os.mkdir(cold)
        # an agent started by the user (a disk shared by several sessions), next to the runtime
        sock = os.path.join(tmp, "agent.sock")
        agent = subprocess.Popen([os.path.join(os.path.dirname(TERRACE), "terrace-storaged"),
                                  "--listen", sock], stderr=subprocess.DEVNULL)
        for _ in range(500):
            if os.path.exists(sock):
                break
            time.sleep(0.01)
        try:
            run_all(tmp, cold, sock)
        finally:
            agent.terminate()
            agent.wait()
    return verdict("test_kv_policies")


def run_all(tmp, cold, sock):
    models = [("MHA olmoe", "olmoe"), ("GQA qwen2", "qwen2"), ("MQA gemma3 (SWA)", "gemma3")]
    toks = synth.token_sequence(160)
    for label, arch in models:
        path = os.path.join(tmp, arch + ".gguf")
        synth.write(arch, "F32", path)
        full, e = logits(path, toks, [], os.path.join(tmp, "f.f32"))
        check(full is not None, f"{label} full: {e}")
        if full is None:
            continue
        # logits --tail (bench_long.py's teacher-forced decode region): the prompt prefilled,
        # the last 24 tokens one decode step each; under full each step predicts what the
        # batched logits of the position before predict (argmax, -log p within float rounding)
        r = subprocess.run([TERRACE, "logits", "-m", path, "--tokens", ",".join(map(str, toks)),
                            "--tail", "24"], capture_output=True, text=True)
        check(r.returncode == 0, f"{label} logits --tail: {r.stderr.strip()}")
        if r.returncode == 0:
            tail = json.loads(r.stdout)
            rows = full[len(toks) - 25:len(toks) - 1].astype(np.float64)
            mx = rows.max(1, keepdims=True)
            ref = (np.log(np.exp(rows - mx).sum(1)) + mx[:, 0]
                   - rows[np.arange(24), np.array(toks[len(toks) - 24:])])
            dn = float(np.abs(np.array(tail["nll"]) - ref).max())
            same = tail["top1"] == [int(v) for v in rows.argmax(1)]
            check(same and dn <= 1e-3, f"{label} logits --tail 24: top-1 same {same}, "
                  f"max |d nll| {dn:.2e}")
            print(f"  {label:18s} logits --tail 24 = the batched logits: top-1 {same}, "
                  f"max |d nll| {dn:.2e}")
            # the run summary's figures beside them: the prompt prefilled, 23 decode steps timed,
            # the KV cache's counters (full: nothing read), the plan and the peak RSS
            summ = (tail.get("prompt") == len(toks) - 24 and tail.get("decode_steps") == 23 and
                    tail.get("prefill_ms", 0) > 0 and tail.get("decode_ms", 0) > 0 and
                    tail.get("kv_policy") == "full" and tail.get("kv_tokens") == len(toks) - 1 and
                    tail.get("kv_bytes_read") == 0 and tail.get("plan_mib", 0) > 0 and
                    tail.get("peak_rss_mib", 0) > 0)
            check(summ, f"{label} logits --tail 24: summary fields {sorted(tail)[:12]}")
            # --kv-prefill-select with --tail: the prompt's rows select as decode steps do (no
            # exact prefill chunk, as kv_quality.py's rows measure); without it the prompt is
            # attended exactly, one gather per chunk of -b rows
            n_chunks = {}
            for how, extra in (("exact", []), ("select", ["--kv-prefill-select"])):
                r = subprocess.run([TERRACE, "logits", "-m", path, "--tokens",
                                    ",".join(map(str, toks)), "--tail", "24", "-b", "64",
                                    "--kv-policy", "tiered", "--kv-alpha", "0.2", "--kv-hot", "64K",
                                    "--kv-cold", cold, *extra], capture_output=True, text=True)
                check(r.returncode == 0, f"{label} logits --tail 24 tiered {how}: {r.stderr.strip()}")
                n_chunks[how] = json.loads(r.stdout).get("kv_prefill_chunks") if r.returncode == 0 else None
            want = -(-(len(toks) - 24) // 64)
            check(n_chunks == {"exact": want, "select": 0},
                  f"{label} logits --tail 24 tiered: exact prefill chunks {n_chunks} "
                  f"(want {want} without --kv-prefill-select, 0 with it)")
        for pol in POLICIES:
            for where, extra in (("hot", []), ("cold", ["--kv-hot", "64K", "--kv-cold", cold])):
                got, e = logits(path, toks, ["--kv-policy", pol, "--kv-alpha", "1", *extra],
                                os.path.join(tmp, "p.f32"))
                check(got is not None, f"{label} {pol} {where}: {e}")
                if got is None:
                    continue
                d = float(np.abs(got - full).max())
                top1 = float(np.mean(got.argmax(1) == full.argmax(1)))
                check(d <= TOL, f"{label} {pol} alpha=1 {where}: max |dlogit| {d:.2e}")
                print(f"  {label:18s} {pol:8s} alpha=1   {where:4s}  max |dlogit| {d:.2e}  "
                      f"top-1 {100 * top1:.1f}%")
            got, e = logits(path, toks, ["--kv-policy", pol, "--kv-alpha", "0.2", "--kv-window",
                                         "16", "--kv-sink", "4"], os.path.join(tmp, "p.f32"))
            check(got is not None, f"{label} {pol} alpha=0.2: {e}")
            if got is not None:
                top1 = float(np.mean(got.argmax(1) == full.argmax(1)))
                print(f"  {label:18s} {pol:8s} alpha=0.2 hot   top-1 vs full {100 * top1:.1f}%")
        # --kv-tail: nothing is left out at alpha 1 (the logits of full); at alpha 0.2 the
        # unselected tokens' estimate brings the logits closer to full's than the selection
        # alone
        sel = ["--kv-policy", "tiered", "--kv-window", "16", "--kv-sink", "4"]
        for where, extra in (("hot", []), ("cold", ["--kv-hot", "64K", "--kv-cold", cold])):
            got, e = logits(path, toks, sel + ["--kv-alpha", "1", "--kv-tail", "4", *extra],
                            os.path.join(tmp, "p.f32"))
            check(got is not None, f"{label} tiered tail alpha=1 {where}: {e}")
            if got is not None:
                d = float(np.abs(got - full).max())
                check(d <= TOL, f"{label} tiered tail alpha=1 {where}: max |dlogit| {d:.2e}")
        # summing every unselected token (--kv-tail-min 0) and only those above the uniform
        # share (the default)
        plain, e = logits(path, toks, sel + ["--kv-alpha", "0.2"], os.path.join(tmp, "a.f32"))
        tl, e2 = logits(path, toks, sel + ["--kv-alpha", "0.2", "--kv-tail", "4",
                                           "--kv-tail-min", "0"], os.path.join(tmp, "t.f32"))
        td, e3 = logits(path, toks, sel + ["--kv-alpha", "0.2", "--kv-tail", "4"],
                        os.path.join(tmp, "d.f32"))
        check(plain is not None and tl is not None and td is not None,
              f"{label} tiered tail alpha=0.2: {e} {e2} {e3}")
        if plain is not None and tl is not None and td is not None:
            dp, dt = float(np.abs(plain - full).mean()), float(np.abs(tl - full).mean())
            dd = float(np.abs(td - full).mean())
            check(dt < 0.7 * dp, f"{label} tiered alpha=0.2: mean |dlogit| vs full {dt:.3e} "
                                 f"with --kv-tail 4 --kv-tail-min 0, {dp:.3e} without")
            check(dd < 0.9 * dp, f"{label} tiered alpha=0.2: mean |dlogit| vs full {dd:.3e} "
                                 f"with --kv-tail 4, {dp:.3e} without")
            print(f"  {label:18s} tiered alpha=0.2: mean |dlogit| vs full {dp:.2e}, "
                  f"{dt:.2e} with --kv-tail 4 --kv-tail-min 0, {dd:.2e} with --kv-tail 4")
        # placement (BKP) and the storage agent never change what tiered computes: the same
        # logits, bit for bit, as host scoring with static placement (the same beta split)
        sel = ["--kv-policy", "tiered", "--kv-alpha", "0.2", "--kv-window", "16", "--kv-sink",
               "4", "--kv-hot", "64K", "--kv-cold", cold, "--kv-beta", "0.5"]
        base, e = logits(path, toks, sel, os.path.join(tmp, "b.f32"))
        check(base is not None, f"{label} tiered cold alpha=0.2: {e}")
        for extra in (["--kv-bkp", "on"], ["--kv-bkp", "naive"], ["--csd"],
                      ["--csd", "--kv-bkp", "on"], ["--csd-socket", sock]):
            got, e = logits(path, toks, sel + extra, os.path.join(tmp, "p.f32"))
            check(got is not None, f"{label} tiered {' '.join(extra)}: {e}")
            if got is None or base is None:
                continue
            same = bool(np.array_equal(got, base))
            check(same, f"{label} tiered {' '.join(extra)}: logits differ from host scoring "
                        f"({float(np.abs(got - base).max()):.2e})")
            shown = " ".join(extra).replace(sock, "SOCKET")
            print(f"  {label:18s} tiered {shown:18s} alpha=0.2 cold: "
                  f"{'identical to' if same else 'DIFFERENT from'} host scoring, static placement")
        # --kv-host-keys: the host keeps keys for the sinks and a ring of the newest positions
        # (40 + the window, two pages and a batch of 8: 96 of 160); its part of the split fits in
        # it, so the logits are host scoring's with the full copy, bit for bit
        b8 = ["-b", "8"]
        hb, e = logits(path, toks, sel + b8, os.path.join(tmp, "b8.f32"))
        hk, e2 = logits(path, toks, sel + b8 + ["--csd", "--kv-host-keys", "40"],
                        os.path.join(tmp, "p.f32"))
        check(hb is not None and hk is not None, f"{label} tiered --kv-host-keys: {e} {e2}")
        if hb is not None and hk is not None:
            same = bool(np.array_equal(hb, hk))
            check(same, f"{label} tiered --csd --kv-host-keys 40: logits differ from host "
                        f"scoring with every key ({float(np.abs(hb - hk).max()):.2e})")
            print(f"  {label:18s} tiered --kv-host-keys 40 alpha=0.2 cold: "
                  f"{'identical to' if same else 'DIFFERENT from'} host scoring with every key")
        # the same with --kv-spec (the selections made ahead score from the ring too)
        sb, e = logits(path, toks, sel + b8 + ["--kv-spec"], os.path.join(tmp, "sb8.f32"))
        sk, e2 = logits(path, toks, sel + b8 + ["--kv-spec", "--csd", "--kv-host-keys", "40"],
                        os.path.join(tmp, "p.f32"))
        check(sb is not None and sk is not None, f"{label} tiered --kv-spec --kv-host-keys: {e} {e2}")
        if sb is not None and sk is not None:
            check(bool(np.array_equal(sb, sk)), f"{label} tiered --kv-spec --csd --kv-host-keys 40: "
                  f"logits differ from host scoring ({float(np.abs(sb - sk).max()):.2e})")
        # --kv-spec: every layer after the first selects with a query speculated from the
        # previous layer's input: the agent gives the host's logits bit for bit, and they are
        # not those of the selection by the real query
        hs, e = logits(path, toks, sel + ["--kv-spec"], os.path.join(tmp, "s.f32"))
        ag, e2 = logits(path, toks, sel + ["--kv-spec", "--csd"], os.path.join(tmp, "p.f32"))
        check(hs is not None and ag is not None, f"{label} tiered --kv-spec: {e} {e2}")
        if hs is not None and ag is not None and base is not None:
            same = bool(np.array_equal(hs, ag))
            check(same, f"{label} tiered --kv-spec: the agent's logits "
                  f"differ from host scoring's ({float(np.abs(hs - ag).max()):.2e})")
            check(not np.array_equal(hs, base), f"{label} tiered --kv-spec: the logits of the "
                  "real query's selection (the speculation is not used)")
            check(bool(np.isfinite(hs).all()), f"{label} tiered --kv-spec: non-finite logits")
            print(f"  {label:18s} tiered --kv-spec alpha=0.2 cold: agent "
                  f"{'identical to' if same else 'DIFFERENT from'} host; "
                  f"mean |dlogit| vs full {float(np.abs(hs - full).mean()):.2e}, "
                  f"{float(np.abs(base - full).mean()):.2e} with the real query")
    if REAL and os.path.exists(REAL):
        # natural text (random ids would give near-tie predictions everywhere)
        text = ("In the beginning God created the heaven and the earth. And the earth was "
                "without form, and void; and darkness was upon the face of the deep. And the "
                "Spirit of God moved upon the face of the waters. And God said, Let there be "
                "light: and there was light. And God saw the light, that it was good: and God "
                "divided the light from the darkness. And God called the light Day, and the "
                "darkness he called Night. And the evening and the morning were the first day.")
        r = subprocess.run([TERRACE, "run", "-m", REAL, "-p", text, "-n", "0", "--verbose",
                            "--no-display-prompt"], capture_output=True, text=True)
        rt = [int(x) for line in r.stderr.splitlines() if line.startswith("terrace: prompt tokens")
              for x in line.split(":", 2)[2].split()]
        full, e = logits(REAL, rt, [], os.path.join(tmp, "f.f32"))
        check(full is not None, f"real model full: {e}")
        # terrace run --kv-prefill-select (kv_quality.py's passkey): the prompt's rows select,
        # no exact chunk; without it the prefill attends exactly in -b chunks
        n_chunks = {}
        for how, extra in (("exact", []), ("select", ["--kv-prefill-select"])):
            tel = os.path.join(tmp, f"tel-{how}.jsonl")
            r = subprocess.run([TERRACE, "run", "-m", REAL, "-p", text, "-n", "2", "--ignore-eos",
                                "--temp", "0", "-b", "32", "--kv-policy", "tiered", "--kv-alpha",
                                "0.2", "--kv-hot", "1M", "--kv-cold", cold, "--telemetry", tel,
                                *extra], capture_output=True, text=True)
            check(r.returncode == 0, f"real model run tiered {how}: {r.stderr.strip()[-300:]}")
            lines = [x for x in open(tel).read().splitlines() if x.strip()] if r.returncode == 0 else []
            n_chunks[how] = json.loads(lines[-1]).get("kv_prefill_chunks") if lines else None
        want = -(-len(rt) // 32)
        check(n_chunks == {"exact": want, "select": 0},
              f"real model run tiered: exact prefill chunks {n_chunks} (want {want} without "
              f"--kv-prefill-select, 0 with it)")
        # the memory plan against the peak RSS with the storage agent: a context filled (RSS
        # counts the KV pages written) whose cold pool's key copies make the agent's own memory
        # (its process, not this one's VmHWM) a fifth of the host's plan; this process's plan
        # must be within 10 % of its peak, and the agent's planned and measured apart
        long = (rt * (4000 // len(rt) + 1))[:3990]
        tf = os.path.join(tmp, "long.txt")
        with open(tf, "w") as f:
            f.write(",".join(map(str, long)))
        r = subprocess.run([TERRACE, "logits", "-m", REAL, "--tokens", "@" + tf, "--tail", "4",
                            "-c", "4096", "--kv-policy", "tiered", "--kv-hot", "2M", "--kv-cold",
                            cold, "--csd"], capture_output=True, text=True)
        check(r.returncode == 0, f"real model tiered + agent, 4K: {r.stderr.strip()[-300:]}")
        if r.returncode == 0:
            d = json.loads(r.stdout)
            ratio = d["peak_rss_mib"] / d["plan_mib"]
            check(0.9 <= ratio <= 1.1 and d["agent_plan_mib"] > 0 and d["agent_peak_rss_mib"] > 0,
                  f"real model tiered + agent, 4K: this process's plan {d['plan_mib']:.1f} MiB, "
                  f"peak RSS {d['peak_rss_mib']:.1f} MiB ({ratio:.2f}x, want 0.90-1.10); the "
                  f"agent's plan {d['agent_plan_mib']:.1f} MiB, peak RSS {d['agent_peak_rss_mib']:.1f} MiB")
            print(f"  default real model tiered + agent, 4K context: plan {d['plan_mib']:.1f} MiB, "
                  f"peak RSS {d['peak_rss_mib']:.1f} MiB ({ratio:.2f}x); the agent's own: plan "
                  f"{d['agent_plan_mib']:.1f} MiB, peak RSS {d['agent_peak_rss_mib']:.1f} MiB")
        # The real model is quantized (Q4_1): activation re-quantization turns any float
        # difference into jumps that 30 layers carry on (parity.py). The noise floor is what
        # merely changing the kernel family (summation order) does to the full cache's logits;
        # a policy at alpha = 1 must stay within twice that.
        scalar, e = logits(REAL, rt, [], os.path.join(tmp, "s.f32"),
                           env=dict(os.environ, TERRACE_ISA="scalar"))
        floor = float(np.abs(scalar - full).max()) if scalar is not None and full is not None else 0
        print(f"  default real model: full, avx vs scalar kernels: max |dlogit| {floor:.2e} (noise floor)")
        for pol in POLICIES:
            got, e = logits(REAL, rt, ["--kv-policy", pol, "--kv-alpha", "1"],
                            os.path.join(tmp, "p.f32"))
            check(got is not None and full is not None, f"real {pol}: {e}")
            if got is None or full is None:
                continue
            d = float(np.abs(got - full).max())
            top1 = float(np.mean(got.argmax(1) == full.argmax(1)))
            check(top1 >= 0.95 and d <= max(2 * floor, 0.1),
                  f"real model {pol} alpha=1: top-1 {top1:.3f}, max {d:.2e} (floor {floor:.2e})")
            print(f"  {'default real model':18s} {pol:8s} alpha=1   hot   max |dlogit| {d:.2e}  "
                  f"top-1 {100 * top1:.1f}%")


if __name__ == "__main__":
    sys.exit(main())
