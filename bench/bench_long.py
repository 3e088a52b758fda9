#!/usr/bin/env python3
"""The user's long-context path (make bench-long; results in bench/results/long.md): a long
prompt prefilled, then 128 tokens decoded greedily, for each KV policy on the same text.

Policies: full (every token in DRAM, the reference), offload, tiered and tiered + the storage
agent (--csd) with the hot pool --kv-policy auto picks under the memory budget, and auto under
that budget (--mem-budget, below what the full KV needs). Per run: prefill time, decode tok/s,
bytes read from storage in prefill and in decode, peak RSS (VmHWM), the plan's total for this
process without its margin (with the agent, its own plan and peak RSS apart: its process), and how
many of the 128 generated tokens equal full's greedy continuation (the agreeing prefix). Then
the quality on the same text, teacher-forced: the prompt followed by the next N_GEN tokens of the
King James text, through `terrace logits --tail N_GEN` with each policy's flags (the prompt
prefilled as the run does, each of those tokens a decode step with the policy's own selection):
the perplexity of those tokens, and the share of positions whose argmax equals full's.

ONE_PASS=1 measures each policy by its teacher-forced pass alone (half the cost: one prefill per
policy): `terrace logits --tail N_GEN` prefills the prompt as a run does and decodes the text's
next N_GEN tokens one step at a time, and reports the prefill and decode times, the KV cache's
counters, the plan and the peak RSS as the run's summary does; the decode rate is that of
N_GEN - 1 teacher-forced decode steps, and the greedy-prefix column is left out. JOBS=2 runs two
policies at once (same load for both: the ratios stay fair on a busy machine), each with THREADS
threads (default 2).

usage: bench_long.py CASE...   CASE: smollm2-8k, qwen2-16k, qwen2-32k (each with its defaults)
  env PROMPT_TOKENS=N shortens a case's prompt (the context stays); N_GEN (default 128);
  POLICIES=full,tiered,auto runs only those (full always, unless ONE_PASS=1 and it is not named);
  QUALITY=0 skips the teacher-forced pass; ONE_PASS, JOBS, THREADS as above; JSON=FILE writes the
  rows (appended, one object a line); MODEL=PATH takes the model from PATH (one case per run);
  KEEP_PASSES=DIR (with ONE_PASS=1) copies each pass's JSON and log into DIR as it ends;
  FULL_PASS=FILE (with ONE_PASS=1, full not run) takes full's top-1 and perplexity from a kept
  pass of the same case (the time ratios stay "—": another run's times)
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TERRACE = os.environ.get("TERRACE_BIN", os.path.join(ROOT, "build", "terrace"))
N_GEN = int(os.environ.get("N_GEN", "128"))
THREADS = os.environ.get("THREADS", "2")
ONE_PASS = os.environ.get("ONE_PASS", "0") == "1"
JOBS = int(os.environ.get("JOBS", "1"))

# key: model key, context, prompt bytes of the King James text (~3.9 bytes a token for both
# tokenizers), --mem-budget for auto (below weights + the full KV + scratch)
CASES = {
    "smollm2-8k": ("smollm2", 8192, 29000, "200M"),
    "qwen2-16k": ("qwen2", 16384, 58000, "620M"),
    "qwen2-32k": ("qwen2", 32768, 116000, "760M"),
}


def model(key):
    if os.environ.get("MODEL"):  # a copy of the model elsewhere (one case per run)
        return os.environ["MODEL"]
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "get_model.sh"), key], check=True,
                          capture_output=True, text=True).stdout.strip()


def kjv(nbytes):
    path = os.path.join(ROOT, "build", "kjv.txt")
    if not os.path.exists(path):
        with open(path, "w") as f:
            subprocess.run(["bible", "gen1:1-rev22:21"], stdout=f, check=True)
    with open(path, errors="replace") as f:
        return f.read(nbytes)


def mib(s):
    v, u = float(s.split()[0]), s.split()[1]
    return v * {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[u]


def run(args, env):
    r = subprocess.run([TERRACE, "run", *args], capture_output=True, text=True, env=env,
                       errors="replace")
    if r.returncode:
        raise SystemExit(f"terrace run {' '.join(args)}: rc {r.returncode}\n{r.stderr[-2000:]}")
    return r.stderr


def prompt_ids(err):
    line = re.search(r"prompt tokens \(\d+\): ([\d ]*)", err)
    return [int(x) for x in line.group(1).split()] if line else []


def quality(m, ids, tail, ctx, flags, tmp, env):
    """(argmax list, nll list) of the last `tail` of ids, teacher-forced (terrace logits --tail)"""
    tf = os.path.join(tmp, "ids.txt")
    with open(tf, "w") as f:
        f.write(",".join(map(str, ids)))
    r = subprocess.run([TERRACE, "logits", "-m", m, "--tokens", "@" + tf, "--tail", str(tail),
                        "-c", str(ctx), "-t", THREADS, *flags], capture_output=True, text=True, env=env,
                       errors="replace")
    if r.returncode:
        raise SystemExit(f"terrace logits {' '.join(flags)}: rc {r.returncode}\n{r.stderr[-2000:]}")
    d = json.loads(r.stdout)
    return d["top1"], d["nll"]


def head_of_run(m, pf, ctx, flags, env):
    """(prompt ids, the kv note) as `terrace run -v` prints them before its prefill, which is not
    waited for: the process is stopped once the ids are out"""
    p = subprocess.Popen([TERRACE, "run", "-m", m, "-f", pf, "-c", str(ctx), "-n", "0", "-v",
                          "-t", "1", *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=env, errors="replace")
    note, ids = "", None
    for line in p.stderr:
        n = re.search(r"kv cache auto: (.*)", line)
        if n:
            note = n.group(1)
        if "prompt tokens (" in line:
            ids = prompt_ids(line)
            break
    p.kill()
    p.wait()
    if ids is None:
        raise SystemExit(f"terrace run {pf}: no prompt tokens printed (rc {p.returncode})")
    return ids, note


def one_pass_start(m, ids, tail, ctx, flags, tmp, env, name):
    tf = os.path.join(tmp, "ids.txt")
    if not os.path.exists(tf):
        with open(tf, "w") as f:
            f.write(",".join(map(str, ids)))
    out = open(os.path.join(tmp, f"pass-{name.replace(' ', '')}.json"), "w+")
    p = subprocess.Popen([TERRACE, "logits", "-m", m, "--tokens", "@" + tf, "--tail", str(tail),
                          "-c", str(ctx), "-t", THREADS, *flags], stdout=out,
                         stderr=subprocess.PIPE, text=True, env=env, errors="replace")
    return p, out


def one_pass_end(name, flags, p, out):
    err = p.communicate()[1]
    if p.returncode:
        raise SystemExit(f"terrace logits {' '.join(flags)}: rc {p.returncode}\n{err[-2000:]}")
    out.seek(0)
    d = json.load(out)
    out.close()
    if os.environ.get("KEEP_PASSES"):  # each pass's output as it ends (a long run keeps what finished)
        keep = os.path.join(os.environ["KEEP_PASSES"], name.replace(" + ", "-").replace(" ", "-"))
        shutil.copy(out.name, keep + ".json")
        with open(keep + ".log", "w") as f:
            f.write(" ".join(flags) + "\n" + err)
    note = re.search(r"kv cache auto: (.*)", err)
    g = {"flags": flags, "prompt": d["prompt"], "prefill_s": d["prefill_ms"] / 1e3,
         "decode_tok_s": 1e3 * d["decode_steps"] / d["decode_ms"], "rss": d["peak_rss_mib"],
         "plan": d["plan_mib"], "note": note.group(1) if note else "", "ids": None,
         "agent": (d.get("agent_plan_mib", 0.0), d.get("agent_peak_rss_mib", 0.0)),
         "read_prefill": d["kv_prefill_bytes_read"] / 2**20,
         "bound": d["kv_prefill_read_bound"] / 2**20, "chunks": d["kv_prefill_chunks"],
         "read_decode": (d["kv_bytes_read"] - d["kv_prefill_bytes_read"]) / 2**20,
         "cold": d["kv_cold_bytes"] / 2**20, "qual": (d["top1"], d["nll"])}
    print(f"  {name}: {g['prompt']} tokens in {g['prefill_s']:.2f} s, decode {g['decode_tok_s']:.2f} tok/s "
          f"(teacher-forced), read {g['read_prefill']:.1f} (bound {g['bound']:.1f}) + {g['read_decode']:.1f} MiB, "
          f"peak RSS {g['rss']:.1f} MiB, ppl {math.exp(sum(d['nll']) / len(d['nll'])):.4f}", file=sys.stderr, flush=True)
    return g


def measure(name, m, pf, ctx, flags, tele, env):
    err = run(["-m", m, "-f", pf, "-c", str(ctx), "-n", str(N_GEN), "--ignore-eos", "--temp", "0",
               "-t", THREADS, "-v", "--telemetry", tele, *flags], env)
    g = {"prompt_ids": prompt_ids(err), "flags": flags}
    p = re.search(r"prompt\s+(\d+) tokens\s+([\d.]+) ms", err)
    d = re.search(r"generated\s+(\d+) tokens\s+([\d.]+) ms\s+([\d.]+) tok/s", err)
    g["prompt"], g["prefill_s"] = int(p.group(1)), float(p.group(2)) / 1e3
    g["decode_tok_s"] = float(d.group(3))
    g["rss"] = float(re.search(r"peak RSS ([\d.]+) MiB", err).group(1))
    pl = re.search(r"plan without the margin ([\d.]+) MiB", err)
    g["plan"] = float(pl.group(1)) if pl else 0.0
    ag = re.search(r"storage agent \(pid \d+, its own process\): plan ([\d.]+) MiB of its own, "
                   r"peak RSS ([\d.]+) MiB", err)
    g["agent"] = (float(ag.group(1)), float(ag.group(2))) if ag else (0.0, 0.0)
    note = re.search(r"kv cache auto: (.*)", err)
    g["note"] = note.group(1) if note else ""
    hot = re.search(r"tiered, hot pool ([\d.]+) MiB", err)
    g["hot"] = hot.group(1) if hot else None
    ids, last = [], {}
    with open(tele) as f:
        for line in f:
            if line.strip():
                last = json.loads(line)
                ids.append(last["id"])
    g["ids"] = ids
    g["read_prefill"] = last.get("kv_prefill_bytes_read", 0) / 2**20
    g["read_decode"] = (last.get("kv_bytes_read", 0) - last.get("kv_prefill_bytes_read", 0)) / 2**20
    g["cold"] = last.get("kv_cold_bytes", 0) / 2**20
    g["bound"] = last.get("kv_prefill_read_bound", 0) / 2**20
    g["chunks"] = last.get("kv_prefill_chunks", 0)
    print(f"  {name}: {g['prompt']} tokens in {g['prefill_s']:.2f} s, decode {g['decode_tok_s']:.2f} tok/s, "
          f"read {g['read_prefill']:.1f} + {g['read_decode']:.1f} MiB, peak RSS {g['rss']:.1f} MiB"
          f"{', ' + g['note'] if g['note'] else ''}", file=sys.stderr, flush=True)
    return g


def one_pass_main(key, m, pf, ctx, budget, text, tmp, env):
    """every policy by its teacher-forced pass alone, JOBS at a time (ONE_PASS=1)"""
    ids = head_of_run(m, pf, ctx, ["--mem-budget", budget], env)[0]
    cf = os.path.join(tmp, "after.txt")
    with open(cf, "w") as f:
        f.write(kjv(len(text) + 16 * N_GEN)[len(text):])
    after = head_of_run(m, cf, ctx, [], env)[0][:N_GEN]
    seq = ids + after
    # the hot pool auto's own pass chooses (the plan counts the process's pages, which differ
    # between commands): its note is out before the prefill, which is not waited for
    p, out = one_pass_start(m, seq, len(after), ctx, ["--mem-budget", budget], tmp, env, "note")
    note = ""
    for line in p.stderr:
        if "kv cache auto: " in line:
            note = line.split("kv cache auto: ", 1)[1].strip()
            break
    p.kill()
    p.wait()
    out.close()
    hot = re.search(r"tiered, hot pool ([\d.]+) MiB", note)
    hot = (hot.group(1) if hot else "64") + "M"

    def cold(name):
        d = os.path.join(tmp, "cold-" + name.replace(" ", "").replace("+", "-"))
        os.makedirs(d, exist_ok=True)
        return d
    runs = [("full", ["--kv-policy", "full"]),
            ("offload", ["--kv-policy", "offload", "--kv-hot", hot, "--kv-cold", cold("offload")]),
            ("tiered", ["--kv-policy", "tiered", "--kv-hot", hot, "--kv-cold", cold("tiered")]),
            ("tiered + agent", ["--kv-policy", "tiered", "--kv-hot", hot, "--kv-cold",
                                cold("agent"), "--csd"]),
            ("auto", ["--mem-budget", budget])]
    want = os.environ.get("POLICIES", "").split(",") if os.environ.get("POLICIES") else None
    runs = [r for r in runs if want is None or r[0] in want]
    if want:  # the order asked for: pairs run together in that order
        runs.sort(key=lambda r: want.index(r[0]))
    res, live = {}, []
    for name, flags in runs:
        if len(live) >= JOBS:
            n0, f0, p0, o0 = live.pop(0)
            res[n0] = one_pass_end(n0, f0, p0, o0)
        print(f"  {name}: started ({' '.join(flags)})", file=sys.stderr, flush=True)
        live.append((name, flags, *one_pass_start(m, seq, len(after), ctx, flags, tmp, env, name)))
    while live:
        n0, f0, p0, o0 = live.pop(0)
        res[n0] = one_pass_end(n0, f0, p0, o0)
    return res, hot, note, len(after)


def main():
    keys = [a for a in sys.argv[1:] if a in CASES] or ["smollm2-8k"]
    for key in keys:
        mkey, ctx, nbytes, budget = CASES[key]
        m = model(mkey)
        tmp = tempfile.mkdtemp(prefix="terrace-long-")
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "xdg"))
        text = kjv(nbytes)
        if os.environ.get("PROMPT_TOKENS"):
            text = text[: int(int(os.environ["PROMPT_TOKENS"]) * 3.9)]
        pf = os.path.join(tmp, "prompt.txt")
        with open(pf, "w") as f:
            f.write(text)
        names = ["full", "offload", "tiered", "tiered + agent", "auto"]
        if ONE_PASS:
            res, hot, note, n_after = one_pass_main(key, m, pf, ctx, budget, text, tmp, env)
            qual = {n: g["qual"] for n, g in res.items()}
            if "full" not in qual and os.environ.get("FULL_PASS"):  # full's pass from another run
                with open(os.environ["FULL_PASS"]) as f:
                    d = json.load(f)
                qual["full"] = (d["top1"], d["nll"])
            auto_note = res["auto"]["note"] if "auto" in res else note
        else:
            res, hot, qual, n_after = two_pass(key, m, pf, ctx, budget, text, tmp, env)
            auto_note = res["auto"]["note"]
        names = [n for n in names if n in res]
        full = res.get("full")
        print(f"\n### {key}: {m.split('/')[-1]}, -c {ctx}, {res[names[0]]['prompt']} prompt tokens, "
              f"{N_GEN} {'teacher-forced' if ONE_PASS else 'generated'}; auto under --mem-budget "
              f"{budget}; hot pool {hot} for offload/tiered; {THREADS} threads"
              f"{f', {JOBS} policies at a time' if JOBS > 1 else ''}\n")
        print(f"auto: {auto_note}\n")
        print("| policy | prefill | vs full | decode tok/s | vs full | read in prefill | bound "
              "| read in decode | cold pool | peak RSS | plan (no margin) | the agent's own: plan / peak RSS | "
              + ("" if ONE_PASS else f"tokens = full's (prefix of {N_GEN}) | ")
              + f"ppl, next {n_after} tokens of the text | top-1 = full's |")
        print("|---|" + "---:|" * (13 if ONE_PASS else 14))
        rows = []
        for name in names:
            g = res[name]
            if name in qual and "full" in qual:
                top1, nll = qual[name]
                ppl = f"{math.exp(sum(nll) / len(nll)):.4f}"
                agree1 = sum(a == b for a, b in zip(top1, qual["full"][0])) / len(top1)
                q = f"{ppl} | {100 * agree1:.1f} %"
            elif name in qual:
                q = f"{math.exp(sum(qual[name][1]) / len(qual[name][1])):.4f} | —"
            else:
                q = "— | —"
            pre = f"{g['prefill_s'] / full['prefill_s']:.2f}x" if full else "—"
            dec = f"{g['decode_tok_s'] / full['decode_tok_s']:.2f}x" if full else "—"
            agree = ""
            if not ONE_PASS:
                n = 0
                for a, b in zip(g["ids"], full["ids"]):
                    if a != b:
                        break
                    n += 1
                agree = f"{n} | "
            print(f"| {name} | {g['prefill_s']:.2f} s | {pre} | {g['decode_tok_s']:.2f} | {dec} | "
                  f"{g['read_prefill']:.1f} MiB | {g['bound']:.1f} MiB in {g['chunks']} chunks | "
                  f"{g['read_decode']:.1f} MiB | {g['cold']:.1f} MiB | "
                  f"{g['rss']:.1f} MiB | {g['plan']:.1f} MiB | "
                  f"{f'{ag[0]:.1f} / {ag[1]:.1f} MiB' if (ag := g.get('agent', (0, 0)))[0] else '—'} | "
                  f"{agree}{q} |", flush=True)
            rows.append({k: v for k, v in g.items() if k not in ("qual", "ids", "prompt_ids")} |
                        {"name": name, "case": key, "ppl": q.split(" | ")[0],
                         "top1_vs_full": q.split(" | ")[1]})
        if os.environ.get("JSON"):
            with open(os.environ["JSON"], "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        shutil.rmtree(tmp, ignore_errors=True)


def two_pass(key, m, pf, ctx, budget, text, tmp, env):
    """each policy run (prefill + N_GEN generated), then its teacher-forced pass"""
    cold = os.path.join(tmp, "cold")
    os.makedirs(cold)
    res = {}
    tele = os.path.join(tmp, "t.jsonl")
    # auto first: its hot pool is the one the others get
    res["auto"] = measure("auto", m, pf, ctx, ["--mem-budget", budget], tele, env)
    hot = (res["auto"]["hot"] or "64") + "M"
    want = os.environ.get("POLICIES", "").split(",") if os.environ.get("POLICIES") else None
    runs = [("full", ["--kv-policy", "full"]),
            ("offload", ["--kv-policy", "offload", "--kv-hot", hot, "--kv-cold", cold]),
            ("tiered", ["--kv-policy", "tiered", "--kv-hot", hot, "--kv-cold", cold]),
            ("tiered + agent", ["--kv-policy", "tiered", "--kv-hot", hot, "--kv-cold", cold, "--csd"])]
    for name, flags in runs:
        if want is None or name == "full" or name in want:
            res[name] = measure(name, m, pf, ctx, flags, tele, env)
    res["auto"]["flags"] = ["--mem-budget", budget]
    full = res["full"]
    names = [n for n in ["full", "offload", "tiered", "tiered + agent", "auto"] if n in res]
    # the text after the prompt, tokenized alone (neither tokenizer adds a BOS), N_GEN ids
    qual = {}
    after = []
    if os.environ.get("QUALITY", "1") != "0":
        cf = os.path.join(tmp, "after.txt")
        with open(cf, "w") as f:
            f.write(kjv(len(text) + 16 * N_GEN)[len(text):])
        after = prompt_ids(run(["-m", m, "-f", cf, "-n", "0", "-v"], env))[:N_GEN]
        ids = full["prompt_ids"] + after
        for name in names:
            qual[name] = quality(m, ids, len(after), ctx, res[name]["flags"], tmp, env)
            print(f"  {name}: teacher-forced ppl {math.exp(sum(qual[name][1]) / len(after)):.4f}",
                  file=sys.stderr, flush=True)
    return res, hot, qual, len(after) or N_GEN


if __name__ == "__main__":
    main()
