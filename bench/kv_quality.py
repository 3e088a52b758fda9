#!/usr/bin/env python3
"""KV-policy quality against the full cache (make bench-kv-quality; results in
bench/results/kv-quality.md and PNG plots next to it).

For each model and each (policy, alpha), next to `full` on the same inputs:
  - perplexity on the King James text (Debian's bible-kjv-text, printed by `bible`) at context
    4K and at the model's longest practical context here;
  - top-1 agreement of next-token predictions over 256 tokens generated (greedily, by full) after
    a long prompt, teacher-forced through the policy;
  - passkey retrieval: a 5-digit number hidden at 10/50/90 % depth in filler text, at 2K..16K
    tokens where the model's context allows; correct if the greedy answer contains it.

usage: kv_quality.py [--quick] [--resume-log FILE] [--report-only] MODEL_KEY...
    keys: smollm2, qwen2 (see scripts/get_model.sh); --resume-log takes the perplexities already
    printed by an interrupted run of the same build (lines "KEY ppl c=CTX POLICY a=ALPHA: PPL")
    env KVQ_OUT=DIR writes the results (json, md, plots) into DIR instead of bench/results (a
    rerun to compare with the recorded one); KVQ_CONFIGS=full@1.0,tiered@0.1,... measures only
    those configurations (policy@alpha); KVQ_PPL_CTX=4096 and KVQ_PASSKEY=2048 only those
    perplexity contexts and passkey lengths; MODEL=PATH takes the model from PATH (one key per run)
"""
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TERRACE = os.environ.get("TERRACE_BIN", os.path.join(ROOT, "build", "terrace"))
PY = os.path.join(ROOT, ".venv", "bin", "python3")
OUT_DIR = os.environ.get("KVQ_OUT") or os.path.join(ROOT, "bench", "results")
CONFIGS = os.environ["KVQ_CONFIGS"].split(",") if os.environ.get("KVQ_CONFIGS") else None
QUICK = "--quick" in sys.argv
RESUME = sys.argv[sys.argv.index("--resume-log") + 1] if "--resume-log" in sys.argv else None
# --only P[,P]: run just these policies (full's figures come from the recorded results) and add
# them to the recorded results of each model
ONLY = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
KEYS = [a for a in sys.argv[1:] if not a.startswith("--") and a != RESUME and
        (ONLY is None or a != ",".join(ONLY))] or ["smollm2", "qwen2"]

ALPHAS = [0.05, 0.1, 0.2]
# tiered+tail: tiered with --kv-tail 4 (the unselected tokens' estimated share of each head's
# attention, from a 4-bit value copy; the tokens above the uniform share, the default
# --kv-tail-min 1); tiered+tail-all: the same summing every unselected token (--kv-tail-min 0)
# tiered+spec: tiered with --kv-spec (each layer's tokens selected with a query speculated from
# the previous layer's input, so that selection and reads overlap that layer's)
POLICIES = ["tiered", "tiered+tail", "tiered+tail-all", "tiered+spec", "h2o", "quest"]
# The models' contexts and what is practical on 2 cores (attention cost grows with the square of
# the context): perplexity at 4K over two chunks with every configuration, and at the longest
# practical context over one chunk with the reduced set; passkey with the reduced set.
MODELS = {
    "smollm2": dict(name="SmolLM2-135M-Instruct Q4_1 (context 8K)", ppl_ctx=[4096, 8192],
                    passkey=[2048, 4096]),
    # 4x the compute of SmolLM2 per token: one chunk at 4K, the reduced set throughout
    "qwen2": dict(name="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (context 32K)", ppl_ctx=[4096],
                  passkey=[2048], ppl_chunks=1, reduced=True),
}
# KVQ_PPL_CTX=4096 / KVQ_PASSKEY=2048: only these perplexity contexts / passkey lengths
for env, field in (("KVQ_PPL_CTX", "ppl_ctx"), ("KVQ_PASSKEY", "passkey")):
    if os.environ.get(env):
        for m in MODELS.values():
            m[field] = [c for c in m[field] if str(c) in os.environ[env].split(",")]
if QUICK:
    for m in MODELS.values():
        m["ppl_ctx"] = m["ppl_ctx"][:1]
        m["passkey"] = m["passkey"][:1]
# the reduced set for the expensive measurements: tiered at every alpha, the baselines at 0.1
REDUCED = [("full", 1.0), ("tiered", 0.05), ("tiered", 0.1), ("tiered", 0.2),
           ("tiered+tail", 0.05), ("tiered+tail", 0.1), ("tiered+tail", 0.2),
           ("tiered+tail-all", 0.05), ("tiered+tail-all", 0.1), ("tiered+tail-all", 0.2),
           ("tiered+spec", 0.1), ("tiered+spec", 0.2), ("h2o", 0.1),
           ("quest", 0.1)]


def only(cfgs):
    return [c for c in cfgs if (ONLY is None or c[0] in ONLY) and
            (CONFIGS is None or f"{c[0]}@{c[1]}" in CONFIGS)]


def sh(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def model_path(key):
    if os.environ.get("MODEL"):  # a copy of the model elsewhere (one key per run)
        return os.environ["MODEL"]
    return os.path.join(ROOT, sh(["bash", os.path.join(ROOT, "scripts", "get_model.sh"), key]).stdout.strip())


def kjv():
    path = os.path.join(ROOT, "build", "kjv.txt")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(sh(["bible", "gen1:1-rev22:21"]).stdout)
    return path


def kv_flags(policy, alpha):
    if policy == "full":
        return []
    if policy in ("tiered+tail", "tiered+tail-all"):
        return ["--kv-policy", "tiered", "--kv-alpha", str(alpha), "--kv-tail", "4"] + \
            (["--kv-tail-min", "0"] if policy == "tiered+tail-all" else [])
    if policy == "tiered+spec":
        return ["--kv-policy", "tiered", "--kv-alpha", str(alpha), "--kv-spec"]
    return ["--kv-policy", policy, "--kv-alpha", str(alpha)]


def configs(cfg=None):
    if cfg and cfg.get("reduced"):
        yield from REDUCED
        return
    yield ("full", 1.0)
    for a in ALPHAS:
        for p in POLICIES:
            yield (p, a)


def resumed():
    """perplexities printed by an interrupted run: {(key, ctx, policy, alpha): ppl}"""
    done = {}
    if RESUME:
        for line in open(RESUME):
            m = re.match(r"(\w+) ppl c=(\d+) (\w+) a=([\d.]+): ([\d.]+)", line)
            if m:
                done[(m[1], int(m[2]), m[3], float(m[4]))] = float(m[5])
    return done


def perplexity(model, text, ctx, policy, alpha, chunks):
    r = sh([TERRACE, "perplexity", "-m", model, "-f", text, "-c", str(ctx), "--chunks", str(chunks),
            *kv_flags(policy, alpha)])
    return float(re.search(r"PPL = ([\d.]+)", r.stdout).group(1))


def cut_text(src, n_chars, dst):
    with open(src) as f:
        data = f.read(n_chars)
    with open(dst, "w") as f:
        f.write(data)
    return dst


def tokenize(model, text):
    r = sh([TERRACE, "run", "-m", model, "-p", text, "-n", "0", "--verbose", "--no-display-prompt",
            "-c", "32768"])
    for line in r.stderr.splitlines():
        if line.startswith("terrace: prompt tokens"):
            return [int(x) for x in line.split(":", 2)[2].split()]
    raise RuntimeError(r.stderr)


def agreement(model, prompt_ids, n_gen, policy, alpha, tmp):
    """greedy tokens of full after the prompt, then every policy teacher-forced on the same tokens"""
    ids = ",".join(map(str, prompt_ids))
    if policy == "full":
        r = sh([TERRACE, "logits", "-m", model, "--tokens", ids, "--greedy", str(n_gen)])
        return json.loads(r.stdout)["tokens"]
    raise AssertionError


def top1(model, seq, policy, alpha, tmp):
    out = os.path.join(tmp, "top1.i32")
    sh([TERRACE, "logits", "-m", model, "--tokens", ",".join(map(str, seq)), "--top1", out,
        "-c", str(len(seq) + 8), *kv_flags(policy, alpha)])
    with open(out, "rb") as f:
        import array
        a = array.array("i")
        a.frombytes(f.read())
    return list(a)


FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
          "again. ")


def passkey_prompt(n_tokens_target, depth, key, tok_per_filler):
    n_fill = max(1, int(n_tokens_target / tok_per_filler))
    before = int(n_fill * depth)
    text = ("There is an important piece of information hidden inside a lot of irrelevant text. "
            "Find it and memorize it. I will quiz you about it.\n" + FILLER * before +
            f"The pass key is {key}. Remember it. {key} is the pass key. " +
            FILLER * (n_fill - before) + "\nWhat is the pass key? The pass key is")
    return text


def passkey_args(model, path, ctx, policy, alpha):
    """`terrace run` of a passkey prompt: the policy selects at every prompt position too, as in
    perplexity and top-1 (a run's prefill otherwise attends exactly and would measure the
    8 decode steps' selection only)"""
    sel = ["--kv-prefill-select"] if policy != "full" else []
    return [TERRACE, "run", "-m", model, "-f", path, "-n", "8", "--temp", "0", "--no-display-prompt",
            "-c", str(ctx), *kv_flags(policy, alpha), *sel]


def passkey(model, text, ctx, policy, alpha, tmp):
    p = os.path.join(tmp, "passkey.txt")
    with open(p, "w") as f:
        f.write(text)
    r = sh(passkey_args(model, p, ctx, policy, alpha))
    return r.stdout


def main():
    import tempfile
    if "--report-only" in sys.argv:  # rewrite the report and plots from the recorded results
        with open(os.path.join(OUT_DIR, "kv-quality.json")) as f:
            write_report(json.load(f))
        return
    text = kjv()
    # results accumulate per model: a run for one model keeps the other's recorded figures
    jpath = os.path.join(OUT_DIR, "kv-quality.json")
    results = {}
    done = resumed()
    if os.path.exists(jpath):
        with open(jpath) as f:
            recorded = json.load(f)
            results = {k: v for k, v in recorded.items() if k not in KEYS or ONLY}
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="terrace-kvq-") as tmp:
        for key in KEYS:
            cfg = MODELS[key]
            model = model_path(key)
            t_model = time.time()
            if ONLY and key in results:
                res = results[key]
                res.setdefault("added", []).append(
                    {"policies": ONLY, "date": time.strftime("%Y-%m-%d")})
            else:
                res = results[key] = {"name": cfg["name"], "ppl": {}, "agree": {}, "passkey": {},
                                      "date": time.strftime("%Y-%m-%d"), "quick": QUICK,
                                      **({"resumed_from": RESUME} if RESUME else {}),
                                      "ppl_chunks": cfg.get("ppl_chunks", 2),
                                      "reduced": cfg.get("reduced", False)}
            # perplexity: enough text for two chunks at each context (~3.5 chars per token)
            for ci, ctx in enumerate(cfg["ppl_ctx"]):
                chunks = cfg.get("ppl_chunks", 2) if ci == 0 else 1
                src = cut_text(text, int(ctx * 2 * 4.2) + 4096, os.path.join(tmp, f"kjv{ctx}.txt"))
                for pol, a in only(configs(cfg) if ci == 0 else REDUCED):
                    t0 = time.time()
                    v = done.get((key, ctx, pol, a))
                    if v is not None:
                        res["ppl"].setdefault(str(ctx), {})[f"{pol}@{a}"] = v
                        print(f"{key} ppl c={ctx} {pol} a={a}: {v:.4f} (from {RESUME})", flush=True)
                        continue
                    v = perplexity(model, src, ctx, pol, a, chunks)
                    res["ppl"].setdefault(str(ctx), {})[f"{pol}@{a}"] = v
                    print(f"{key} ppl c={ctx} {pol} a={a}: {v:.4f} ({time.time() - t0:.0f} s)", flush=True)
            # top-1 agreement over 256 generated tokens after a ~3000-token prompt
            with open(text) as f:
                f.seek(2_000_000)
                prompt_text = f.read(12000)
            prompt = tokenize(model, prompt_text)[:3000]
            n_gen = 128 if QUICK else 256
            gen = agreement(model, prompt, n_gen, "full", 1.0, tmp)
            seq = prompt + gen
            for pol, a in only(configs(cfg)):
                t0 = time.time()
                pred = top1(model, seq, pol, a, tmp)
                # position len(prompt)-1+i predicts gen[i]
                hits = sum(1 for i in range(n_gen) if pred[len(prompt) - 1 + i] == gen[i])
                res["agree"][f"{pol}@{a}"] = hits / n_gen
                print(f"{key} top-1 agreement {pol} a={a}: {100 * hits / n_gen:.1f}% ({time.time() - t0:.0f} s)", flush=True)
            # passkey
            tpf = len(tokenize(model, FILLER * 20)) / 20
            for ctx in cfg["passkey"]:
                for depth in (0.1, 0.5, 0.9):
                    key_num = 10007 + int(depth * 1000) * 7 + ctx % 997
                    prompt_text = passkey_prompt(ctx - 96, depth, key_num, tpf)
                    for pol, a in only(REDUCED):
                        t0 = time.time()
                        out = passkey(model, prompt_text, ctx, pol, a, tmp)
                        ok = str(key_num) in out
                        res["passkey"].setdefault(f"{pol}@{a}", {})[f"{ctx}/{depth}"] = ok
                        print(f"{key} passkey {ctx} depth {depth} {pol} a={a}: {'ok' if ok else 'miss'} "
                              f"({out.strip()[:30]!r}, {time.time() - t0:.0f} s)", flush=True)
            if ONLY and res.get("added"):
                res["added"][-1]["minutes"] = round((time.time() - t_model) / 60)
            else:
                res["minutes"] = round((time.time() - t_model) / 60)
            with open(jpath, "w") as f:
                json.dump(results, f, indent=1)
    write_report(results)


def write_report(results):
    lines = ["# KV-cache policies: quality against the full cache", "",
             "`make bench-kv-quality` (`bench/kv_quality.py`; each model's run date and time "
             "below). Sinks 4, window 64, INT8 scoring. "
             "The policy selects keys for every query position (prompt and generation alike). "
             "Perplexity on the King James text (llama.cpp's method: two chunks of c tokens at 4K "
             "with every configuration, one chunk at the longest context with tiered at each alpha "
             "and the baselines at 0.1); top-1 "
             "agreement with full's greedy choice over 256 generated tokens (128 with --quick) after a 3000-token "
             "prompt (teacher-forced); passkey: a 5-digit number at 10/50/90 % depth in filler, "
             "correct if the 8-token greedy answer contains it (tiered at each alpha, the baselines at "
             "0.1, and full). tiered+tail: tiered with `--kv-tail 4`, each head's output completed "
             "with the unselected tokens' share of its attention, weighted from their scores, over a "
             "4-bit copy of the values (DRAM), for the tokens whose share of a head is at least the "
             "uniform one (the default `--kv-tail-min 1`); tiered+tail-all: every unselected token "
             "(`--kv-tail-min 0`). tiered+spec: tiered with `--kv-spec`, each layer's tokens "
             "selected with a query speculated from the previous layer's input (that layer's "
             "own query projection of it), as the storage agent's pipeline uses it; the "
             "attention itself uses the real query.", ""]
    for key, res in results.items():
        lines += [f"## {res['name']}", "",
                  f"Run {res.get('date', '?')}, {res.get('minutes', '?')} min"
                  f"{' (--quick: the first perplexity context and passkey length only, 128 generated tokens)' if res.get('quick') else ''}"
                  f"; perplexity over {res.get('ppl_chunks', 2)} chunk(s) at the first context"
                  f"{'; the reduced set throughout (tiered at every alpha, the baselines at 0.1)' if res.get('reduced') else ''}"
                  f"; passkey at {', '.join(sorted({k.split('/')[0] for v in res['passkey'].values() for k in v}, key=int))} tokens"
                  f"{'; the perplexities already printed by an earlier, interrupted run of the same build were taken from its log: ' + res['resumed_from'] if res.get('resumed_from') else ''}."]
        for note in res.get("notes", []):  # written into kv-quality.json by hand
            lines += ["", note]
        for ad in res.get("added", []):
            lines += [""]
            lines.append(f"Rows of {', '.join(ad['policies'])} added {ad['date']} by a run with "
                         f"`--only` ({ad.get('minutes', '?')} min, that day's build; full's figures "
                         f"from the run above){'; ' + ad['note'] if ad.get('note') else ''}.")
        lines.append("")
        ctxs = list(res["ppl"])
        head = "| policy | alpha | " + " | ".join(f"PPL c={c}" for c in ctxs) + \
               " | top-1 agreement | passkey |"
        lines += [head, "|" + "---|" * (4 + len(ctxs))]
        order = ["full"] + POLICIES
        for cfgkey in sorted(res["agree"], key=lambda k: (k.split("@")[0] != "full",
                                                          float(k.split("@")[1]),
                                                          order.index(k.split("@")[0]))):
            pol, a = cfgkey.split("@")
            cells = []
            for c in ctxs:
                v, ref = res["ppl"][c].get(cfgkey), res["ppl"][c]["full@1.0"]
                cells.append("–" if v is None else
                             f"{v:.3f} ({100 * (v / ref - 1):+.2f}%)" if pol != "full" else f"{v:.3f}")
            pk = res["passkey"].get(cfgkey, {})
            pks = f"{sum(pk.values())}/{len(pk)}" if pk else "–"
            lines.append(f"| {pol} | {a if pol != 'full' else '—'} | " + " | ".join(cells) +
                         f" | {100 * res['agree'][cfgkey]:.1f}% | {pks} |")
        lines.append("")
    with open(os.path.join(OUT_DIR, "kv-quality.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        for key, res in results.items():
            fig, axes = plt.subplots(1, 2, figsize=(10, 4))
            c = list(res["ppl"])[0]
            for pol in POLICIES:
                xs = [a for a in ALPHAS if f"{pol}@{a}" in res["ppl"][c]]
                axes[0].plot(xs, [100 * (res["ppl"][c][f"{pol}@{a}"] / res["ppl"][c]["full@1.0"] - 1) for a in xs],
                             marker="o", label=pol)
                xs = [a for a in ALPHAS if f"{pol}@{a}" in res["agree"]]
                axes[1].plot(xs, [100 * res["agree"][f"{pol}@{a}"] for a in xs], marker="o", label=pol)
            axes[0].axhline(1.0, ls="--", c="gray", lw=0.8)
            axes[0].set(xlabel="alpha", ylabel=f"PPL vs full, % (c={c})", title=res["name"])
            axes[1].axhline(98, ls="--", c="gray", lw=0.8)
            axes[1].set(xlabel="alpha", ylabel="top-1 agreement with full, %")
            for ax in axes:
                ax.legend()
                ax.grid(alpha=0.3)
            fig.tight_layout()
            fig.savefig(os.path.join(OUT_DIR, f"kv-quality-{key}.png"), dpi=100)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
