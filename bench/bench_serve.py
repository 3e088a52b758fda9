#!/usr/bin/env python3
"""terrace serve vs llama.cpp's server as PyPI ships it (llama-cpp-python[server],
`python -m llama_cpp.server`), same model, same threads, same run: aggregate decode throughput and
time to first token at 1, 4, 8 and 16 concurrent streams.

Models: the default model (SmolLM2-135M-Instruct Q4_1), and the 1 GiB synthetic qwen3moe of
bench/bench_moe.sh inside a memory cgroup capped at half its size (page cache counted), caches
dropped before each server starts.

Load: C client threads, each sending R streamed /v1/completions requests back to back (greedy,
max_tokens tokens, a different prompt each). "staggered": client i starts i/C of one 1-stream
request's duration after the first, so arrivals are spread as in steady serving; "burst": all C
start at once (every round then arrives together). Per phase:
  aggregate tok/s  = generated tokens of all requests / wall time from the first request to the
                     last answer (prefill included: what the clients get);
  TTFT p50 / p99   = request sent -> first text chunk received.
Tokens are the usage counts (terrace) or the text chunks (llama.cpp's server sends one per token).

Needs root for the cgroup (cgroup v1 memory controller) and drop_caches, like bench_moe.sh.
Results: bench/results/serve.md (+ serve.json), a pair of sections per machine (the CPU's name and
its widest vector ISA): a run rewrites this machine's sections and keeps every other machine's; with
--only it rewrites that model's section and keeps the other one (from serve.json, with its own
date, commit and machine); a hand-written "## Notes" section at the end of serve.md is kept.

usage: bench_serve.py [--quick] [--only dense|moe] [--levels 1,4,8,16] [--servers terrace,peer]
                      [--terrace BIN] [--no-write]

--terrace runs another terrace binary (a paired run: main's build against a branch's, alternated
in one window); --no-write prints the rows and leaves serve.md and serve.json as they are.

--servers runs one server only (the capped MoE's llama.cpp phases alone take minutes): the other
one's rows of that section are kept from serve.json with the date and commit of their own run.
"""
import argparse
import datetime
import http.client
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from serve_util import sse_events  # noqa: E402 (the SSE reader the serve tests use)
PEER_PY = ".venv-peer/bin/python3"
CG = "/sys/fs/cgroup/memory/terrace-bench-serve"
THREADS = int(os.environ.get("THREADS", os.cpu_count() or 2))

ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
ap.add_argument("--only", choices=["dense", "moe"])
ap.add_argument("--levels", default="1,4,8,16")
ap.add_argument("--servers", default="terrace,peer",
                help="the servers to run (terrace, peer or both): a server not run keeps its rows "
                     "of that section from serve.json, and the report names their run")
ap.add_argument("--terrace", default="./build/terrace", help="the terrace binary to run")
ap.add_argument("--no-write", action="store_true",
                help="print the rows only; serve.md and serve.json are left as they are")
args = ap.parse_args()
LEVELS = [int(x) for x in args.levels.split(",")]
SERVERS = set(args.servers.split(","))
if not SERVERS or SERVERS - {"terrace", "peer"}:
    ap.error("--servers takes terrace, peer or terrace,peer")

WORDS = ("river stone lantern harbor meadow violin comet forest glacier orchard canyon lighthouse "
         "market island temple desert library garden mountain village").split()


def prompt(i):
    a, b, c = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)], WORDS[(i * 13 + 5) % len(WORDS)]
    return f"Story {i}. Write a long story about a {a}, a {b} and a {c}. It begins:"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def setup_cgroup(cap):
    os.makedirs(CG, exist_ok=True)
    with open(f"{CG}/memory.limit_in_bytes", "w") as f:
        f.write(str(cap))
    try:
        with open(f"{CG}/memory.swappiness", "w") as f:
            f.write("0")
    except OSError:
        pass


def start(kind, model, port, capped, extra):
    log = open(f"build/bench/serve-{kind}-{os.path.basename(model)}.log", "w")
    if kind == "terrace":
        cmd = [args.terrace, "serve", "-m", model, "--port", str(port), "-t", str(THREADS), *extra]
    else:
        # llama.cpp's server, one model, requests served one at a time (interrupt_requests off:
        # with it on, a waiting request cuts the stream in progress short)
        cmd = [PEER_PY, "-c", PEER_LAUNCH, "--model", model, "--port", str(port),
               "--host", "127.0.0.1", "--n_threads", str(THREADS), "--n_threads_batch",
               str(THREADS), "--interrupt_requests", "False", *extra]
    pre = None
    if capped:
        def pre():
            with open(f"{CG}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pre)
    deadline = time.time() + 600
    while time.time() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"{kind} exited: " + open(log.name).read()[-2000:])
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v1/models")
            if c.getresponse().status == 200:
                return p, log.name
        except OSError:
            pass
        time.sleep(0.2)
    p.kill()
    raise RuntimeError(f"{kind} did not start")


# llama.cpp with weight repacking off (use_extra_bufts = False) when asked, as bench_moe.sh runs
# it under a memory cap: repacking copies the weights out of the mapping into memory
PEER_LAUNCH = r"""
import os, sys
if os.environ.get("PEER_NO_REPACK"):
    import llama_cpp, llama_cpp.llama_cpp as lc
    orig = lc.llama_model_default_params
    def no_repack():
        p = orig(); p.use_extra_bufts = False; return p
    lc.llama_model_default_params = no_repack
    llama_cpp.llama_model_default_params = no_repack
from llama_cpp.server.__main__ import main
sys.argv[0] = "llama_cpp.server"
main()
"""


def one_request(port, i, max_tokens, out):
    body = json.dumps({"prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, chunks, usage = None, 0, None
    for data in sse_events(r):
        if data == "[DONE]":
            continue
        o = json.loads(data)
        if o.get("usage"):
            usage = o["usage"]["completion_tokens"]
        for ch in o.get("choices") or []:
            if ch.get("text"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    c.close()
    out.append({"t0": t0, "t1": t1, "ttft": ttft if ttft is not None else t1 - t0,
                "tokens": usage if usage is not None else chunks, "chunks": chunks})


def phase(port, conc, reps, max_tokens, stagger_s, base):
    out = []
    lock = threading.Lock()

    def client(k):
        time.sleep(k * stagger_s / conc)
        for rr in range(reps):
            res = []
            one_request(port, base + k * reps + rr, max_tokens, res)
            with lock:
                out.extend(res)

    th = [threading.Thread(target=client, args=(k,)) for k in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    t_first = min(x["t0"] for x in out)
    t_last = max(x["t1"] for x in out)
    tokens = sum(x["tokens"] for x in out)
    ttfts = sorted(x["ttft"] for x in out)

    def pct(p):
        k = (len(ttfts) - 1) * p / 100
        lo = int(k)
        hi = min(lo + 1, len(ttfts) - 1)
        return ttfts[lo] + (ttfts[hi] - ttfts[lo]) * (k - lo)

    return {"conc": conc, "requests": len(out), "tokens": tokens, "wall_s": t_last - t_first,
            "tok_s": tokens / (t_last - t_first), "ttft_p50_ms": 1e3 * pct(50),
            "ttft_p99_ms": 1e3 * pct(99), "lat_s": statistics.mean(x["t1"] - x["t0"] for x in out)}


def run_server(kind, model, capped, extra, env_extra, reps, max_tokens, patterns, levels=None):
    port = free_port()
    if capped:
        drop_caches()
    env_backup = dict(os.environ)
    os.environ.update(env_extra)
    try:
        p, log = start(kind, model, port, capped, extra)
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
    rows = []
    try:
        # warm-up: one short request (the first touches the weights; under the cap it fills the
        # expert cache), not measured
        one_request(port, 10_000, 8, [])
        base = 0
        single = None
        for pat in patterns:
            for conc in levels or LEVELS:
                stagger = 0.0
                if pat == "staggered" and conc > 1 and single:
                    stagger = single["lat_s"]
                r = phase(port, conc, reps(conc), max_tokens, stagger, base)
                base += 1000
                r["pattern"] = pat if conc > 1 else "single"
                if conc == 1:
                    if single:  # the 1-stream phase is the same in both patterns
                        continue
                    single = r
                rows.append(r)
                print(f"  {kind:8s} {r['pattern']:9s} {conc:2d} streams: {r['tok_s']:8.2f} tok/s, "
                      f"TTFT p50 {r['ttft_p50_ms']:8.1f} p99 {r['ttft_p99_ms']:8.1f} ms "
                      f"({r['requests']} requests, {r['tokens']} tokens, {r['wall_s']:.1f} s)",
                      flush=True)
        rss = None
        try:
            with open(f"/proc/{p.pid}/status") as f:
                rss = int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024
        except (OSError, AttributeError):
            pass
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    return {"rows": rows, "peak_rss_mib": rss, "log": open(log).read()[-4000:]}


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine():
    """the machine a run's figures belong to: the CPU's name, which reads the same on CPUs of
    different generations (a VM's "AMD EPYC"), and the widest vector ISA the kernels can use"""
    try:
        flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split()
    except OSError:
        flags = []
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else platform.machine()
    return f"{cpu_name()}, {isa}"


def old_machines():
    try:
        with open("bench/results/serve.json") as f:
            return json.load(f).get("machines", {})
    except (OSError, ValueError):
        return {}


def old_section(key):
    return old_machines().get(machine(), {}).get(key)


def run_sides(key, r):
    """runs the servers asked for; a server not run keeps its rows from serve.json"""
    prev = None
    for side in ("terrace", "peer"):
        if side in SERVERS:
            r[side] = r[side]()
            continue
        prev = prev or old_section(key)
        if not prev or side not in prev or (prev.get(side + "_meta") or {}).get("absent"):
            # nothing of that server on this machine yet: its cells read "–"
            r[side] = {"rows": [], "peak_rss_mib": None}
            r[side + "_meta"] = {"absent": True}
            continue
        r[side] = prev[side]
        r[side + "_meta"] = prev.get(side + "_meta", prev.get("meta"))


def main():
    os.makedirs("build/bench", exist_ok=True)
    results = {}
    quick = args.quick
    dense = subprocess.run(["bash", "scripts/get_model.sh", "smollm2"], capture_output=True,
                           text=True, check=True).stdout.strip()
    if args.only in (None, "dense"):
        print(f"bench-serve: dense model {dense}", flush=True)
        reps = (lambda c: 1) if quick else (lambda c: 3)
        pats = ["staggered", "burst"]
        t_extra = ["-np", "16", "-c", "1024"]
        p_extra = ["--n_ctx", "2048"]
        results["dense"] = {
            "model": dense, "max_tokens": 64,
            "terrace": (lambda: run_server("terrace", dense, False, t_extra, {}, reps, 64, pats)),
            "peer": (lambda: run_server("peer", dense, False, p_extra, {}, reps, 64, pats)),
            "terrace_flags": t_extra, "peer_flags": p_extra}
        run_sides("dense", results["dense"])
    if args.only in (None, "moe"):
        moe = "build/bench/qwen3moe-1g-Q4_K_M.gguf"
        if not os.path.exists(moe):
            print("bench-serve: writing the synthetic qwen3moe model (F16, then Q4_K_M by llama.cpp)")
            subprocess.run([".venv/bin/python3", "tests/py/synth.py", "qwen3moe-1g", "F16",
                            "build/bench/qwen3moe-1g-F16.gguf"], check=True)
            subprocess.run([PEER_PY, "tests/py/llama_ref.py", "quantize",
                            "build/bench/qwen3moe-1g-F16.gguf", moe, "15"], check=True)
            os.remove("build/bench/qwen3moe-1g-F16.gguf")
        size = os.path.getsize(moe)
        cap = size // 2
        setup_cgroup(cap)
        print(f"bench-serve: MoE {moe} ({size >> 20} MiB) under a {cap >> 20} MiB cap", flush=True)
        t_extra = ["-np", "16", "-c", "256", "-b", "64"]
        # llama_cpp.server locks the model in memory by default (use_mlock = llama_supports_mlock(),
        # unlike the Llama class bench_moe.sh uses): under the cap that pins every mapped page and
        # the cgroup kills it while loading. Off, its weights stay mapped and the kernel pages them.
        p_extra = ["--n_ctx", "256", "--use_mlock", "False"]
        mt = 16 if quick else 32
        results["moe"] = {
            "model": moe, "size": size, "cap": cap, "max_tokens": mt,
            "terrace": (lambda: run_server("terrace", moe, True, t_extra, {}, (lambda c: 1) if quick
                                           else (lambda c: 2), mt, ["staggered", "burst"])),
            # the peer serves one request at a time (its aggregate does not depend on the count
            # of streams) at about 1.5 tok/s under this cap: one request per stream, and no
            # 16-stream phase (it alone would take ~6 minutes), keep its run within the
            # benchmark's time
            "peer": (lambda: run_server("peer", moe, True, p_extra, {"PEER_NO_REPACK": "1"},
                                        lambda c: 1, mt, ["staggered"], [x for x in LEVELS if x <= 8])),
            "terrace_flags": t_extra, "peer_flags": p_extra}
        run_sides("moe", results["moe"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    meta = {"date": str(datetime.date.today()), "commit": commit, "cpu": machine(),
            "threads": THREADS, "command": "make bench-serve (bench/bench_serve.py" +
            (" --quick" if quick else "") + (f" --only {args.only}" if args.only else "") +
            (f" --levels {args.levels}" if args.levels != "1,4,8,16" else "") + ")"}
    for v in results.values():
        v["meta"] = meta
        if "peer_meta" in v or "terrace_meta" in v:
            v["meta"] = dict(meta, command=meta["command"][:-1] + f" --servers {args.servers})")
    # other machines' sections are kept; --only keeps this machine's other model from an earlier
    # run (each section names its run)
    machines = old_machines()
    here = machine()
    if args.only:
        for k, v in machines.get(here, {}).items():
            if k not in results:
                results[k] = v
    if args.no_write:
        return
    machines.pop(here, None)
    machines[here] = results
    with open("bench/results/serve.json", "w") as f:
        json.dump({"machines": machines}, f, indent=1)
    write_report(machines)


def section(w, title, key, r):
    """one model's table and goals of one machine's run"""
    t, p = r["terrace"], r["peer"]
    meta = r["meta"]
    w(f"## {title}\n")
    # "run": the run's line as written by hand where the rows came from more than one run
    w(meta.get("run") or f"{meta['date']}, commit {meta['commit']}, `{meta['command']}`, "
      f"{meta['cpu']}, {meta['threads']} threads for both servers.")
    w("")
    for side, name in (("terrace", "terrace"), ("peer", "llama.cpp")):
        km = r.get(side + "_meta")
        if km and km.get("absent"):
            w(f"{name} was not run for this section on this machine: its cells read \"–\".\n")
        elif km:
            w(f"{name}'s rows are kept from an earlier run ({km['date']}, commit {km['commit']}, "
              f"`{km['command']}`): this one ran the other server only.\n")
    extra = ""
    if key == "moe":
        extra = (f" ({r['size'] >> 20} MiB, qwen3moe, 64 experts top-8) in a memory cgroup of "
                 f"{r['cap'] >> 20} MiB (half the file, page cache counted), caches dropped "
                 "before each server starts; llama.cpp with weight repacking off, as in "
                 "bench_moe.sh")
    w(f"`{r['model']}`{extra}; {r['max_tokens']} tokens per request. terrace `serve "
      f"{' '.join(r['terrace_flags'])}`, peer `{' '.join(r['peer_flags'])}`. Peak RSS: terrace "
      f"{t['peak_rss_mib'] or 0:.0f} MiB, llama.cpp "
      f"{p.get('peak_rss_text') or ('%.0f MiB' % p['peak_rss_mib'] if p['peak_rss_mib'] else '–')}.\n")
    w("| arrivals | streams | terrace tok/s | llama.cpp tok/s | terrace / llama.cpp | "
      "terrace TTFT p50 / p99 ms | llama.cpp TTFT p50 / p99 ms |")
    w("|---|---:|---:|---:|---:|---:|---:|")
    for x in t["rows"]:
        # the peer's row of the same arrivals and streams, "–" where it did not run that phase
        y = next((z for z in p["rows"] if (z["pattern"], z["conc"]) == (x["pattern"], x["conc"])),
                 None)
        ys = (f"{y['tok_s']:.2f}", f"{x['tok_s'] / y['tok_s']:.2f}x",
              f"{y['ttft_p50_ms']:.0f} / {y['ttft_p99_ms']:.0f}") if y else ("–", "–", "–")
        w(f"| {x['pattern']} | {x['conc']} | {x['tok_s']:.2f} | {ys[0]} | {ys[1]} | "
          f"{x['ttft_p50_ms']:.0f} / {x['ttft_p99_ms']:.0f} | {ys[2]} |")
    w("")
    one = next((x for x in t["rows"] if x["conc"] == 1), None)
    eight = next((x for x in t["rows"] if x["conc"] == 8 and x["pattern"] == "staggered"), None)
    peer8 = next((x for x in p["rows"] if x["conc"] == 8 and x["pattern"] == "staggered"), None)
    if eight and one:
        goals = [("8 streams >= 3x terrace's 1-stream aggregate", eight["tok_s"] / one["tok_s"], 3.0)]
        if peer8:
            goals.append((f"8 streams >= {'2' if key == 'dense' else '10'}x the peer's aggregate",
                          eight["tok_s"] / peer8["tok_s"], 2.0 if key == "dense" else 10.0))
        goals.append(("TTFT p99 at 8 streams <= 2x the 1-stream TTFT (p99)",
                      one["ttft_p99_ms"] * 2 / max(1e-9, eight["ttft_p99_ms"]), 1.0))
        for name, v, goal in goals:
            shown = f"{v:.2f}x" if "TTFT" not in name else \
                f"{eight['ttft_p99_ms']:.0f} ms vs {one['ttft_p99_ms']:.0f} ms ({eight['ttft_p99_ms'] / one['ttft_p99_ms']:.2f}x)"
            w(f"- {name} (staggered arrivals): {shown} — {'met' if v >= goal else 'NOT met'}")
        burst8 = next((x for x in t["rows"] if x["conc"] == 8 and x["pattern"] == "burst"), None)
        if burst8:
            w(f"- burst arrivals (8 requests at once, every round): {burst8['tok_s'] / one['tok_s']:.2f}x "
              f"the 1-stream aggregate, TTFT p99 {burst8['ttft_p99_ms']:.0f} ms "
              f"({burst8['ttft_p99_ms'] / one['ttft_p99_ms']:.2f}x the 1-stream TTFT)")
    w("")


def write_report(machines):
    out = []
    w = out.append
    w("# terrace serve vs llama.cpp's server: continuous batching\n")
    w("Peer: `python -m llama_cpp.server` from llama-cpp-python 0.3.36 built from source "
      "(scripts/peer.sh), `--interrupt_requests False` (otherwise a waiting request cuts the "
      "running stream short); it serves one request at a time. Both servers get the same threads "
      "and the same requests in the same run: streamed /v1/completions, greedy, a different "
      "prompt per request; aggregate tok/s = generated tokens / wall time of the phase (prefill "
      "included); TTFT = request sent -> first text chunk.\n")
    for mach, results in machines.items():
        for key, title in (("dense", "Default model"), ("moe", "1 GiB synthetic MoE under a memory cap")):
            if key in results:
                section(w, f"{title}: {mach}", key, results[key])
    # a hand-written "## Notes" section at the end of serve.md (what a table alone does not
    # say) is kept as it is: a run rewrites the measured sections only
    notes = ""
    try:
        with open("bench/results/serve.md") as f:
            old = f.read()
        at = old.find("\n## Notes\n")
        if at >= 0:
            notes = old[at + 1:]
    except OSError:
        pass
    with open("bench/results/serve.md", "w") as f:
        f.write("\n".join(out) + "\n" + notes)
    print("\n".join(out))


if __name__ == "__main__":
    main()
