#!/usr/bin/env python3
"""Route traces for judging expert-cache policies beyond the one real trace we have.

  route_traces.py record TERRACE OUTDIR [ARCH...]
      For every MoE architecture (or the ones named): writes the structured-router synthetic
      model of synth.py (ARCH-routes), a prompt whose text changes topic every few hundred tokens
      (and comes back to earlier topics), and records `terrace run --route-trace` over it, one
      token per step (-b 1, so every routing decision is a decode step), then 256 sampled tokens.
      -> OUTDIR/ARCH.route.csv

  route_traces.py invert TRACE OUTDIR
      Traces that invert the statistics of a real one, from its decode tokens:
        reversed   the decode tokens in reverse order (drift runs backwards)
        shuffled   the decode tokens in a random order (no sequence: only frequency is left)
        relabeled  every 8 tokens each layer's expert ids are permuted anew (popularity lasts 8
                   tokens: only recency is left, frequency misleads)
        mixed      the odd layers' choices replaced by uniformly random ones (the layers differ
                   in how much caching them is worth: equal per-layer shares misallocate)
      -> OUTDIR/NAME-VARIANT.route.csv

Stdlib only (the model writer needs the venv's gguf and numpy: run with .venv/bin/python3).
"""
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MOE = ["qwen3moe", "qwen2moe", "olmoe", "phimoe", "mixtral", "gpt-oss"]
TOPICS = 4


def prompt_text(n, seed):
    """n characters, in segments of 150-400 of one topic each (topic = (ord(c) - 33) % 4, the
    synthetic vocabulary's token id mod 4, see synth.topic_of_token); topics recur"""
    rnd = random.Random(seed)
    letters = [c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    by_topic = [[c for c in letters if (ord(c) - 33) % TOPICS == t] for t in range(TOPICS)]
    out, topic = [], 0
    while len(out) < n:
        seg = rnd.randint(150, 400)
        # a few "words" of the topic repeated inside the segment: phrases that come back
        words = ["".join(rnd.choice(by_topic[topic]) for _ in range(rnd.randint(3, 7)))
                 for _ in range(6)]
        while seg > 0:
            w = rnd.choice(words) if rnd.random() < 0.7 else rnd.choice(by_topic[topic])
            out.append(w)
            seg -= len(w)
        topic = rnd.choice([t for t in range(TOPICS) if t != topic])
    return "".join(out)[:n]


def record(terrace, outdir, archs):
    os.makedirs(outdir, exist_ok=True)
    py = sys.executable
    for i, arch in enumerate(archs):
        model = os.path.join(outdir, arch + "-routes.gguf")
        subprocess.run([py, os.path.join(HERE, "synth.py"), arch + "-routes", "F16", model],
                       check=True)
        pf = os.path.join(outdir, arch + ".prompt.txt")
        with open(pf, "w") as f:
            f.write(prompt_text(1200, 100 + i))
        trace = os.path.join(outdir, arch + ".route.csv")
        cmd = [terrace, "run", "-m", model, "-f", pf, "-b", "1", "-n", "256", "-c", "2048",
               "--temp", "0.8", "-s", str(1 + i), "--ignore-eos", "-t", "1",
               "--route-trace", trace, "--no-display-prompt"]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit(f"FAIL: {' '.join(cmd)}: {r.stderr.strip()}")
        os.remove(model)
        print(f"{arch}: {trace}")


def read_trace(path):
    head, rows = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or line.startswith("turn,"):
                head.append(line)
            elif line.strip():
                p = line.rstrip("\n").split(",")
                rows.append([int(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]),
                             p[6], int(p[7]), int(p[8])])
    return head, rows


def write_trace(path, head, rows):
    with open(path, "w") as f:
        f.writelines(head)
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")


def invert(trace, outdir):
    os.makedirs(outdir, exist_ok=True)
    head, rows = read_trace(trace)
    n_expert = int([x for x in head[1].split() if x.startswith("n_expert=")][0].split("=")[1])
    pre = [r for r in rows if r[1] == 0]
    dec = [r for r in rows if r[1] == 1]
    steps = sorted({(r[0], r[2]) for r in dec})
    by_step = {s: [] for s in steps}
    for r in dec:
        by_step[(r[0], r[2])].append(r)
    name = os.path.basename(trace).split(".")[0]
    rnd = random.Random(7)

    def emit(variant, order, transform=None):
        out = list(pre)
        for i, s in enumerate(order):
            new_step = steps[i][1]
            rs = sorted(by_step[s], key=lambda r: (r[3], r[4]))
            if transform:
                rs = transform(i, rs)
            for r in rs:
                out.append([steps[i][0], 1, new_step] + r[3:])
        path = os.path.join(outdir, f"{name}-{variant}.route.csv")
        write_trace(path, head, out)
        print(f"{variant}: {path}")

    emit("reversed", steps[::-1])
    sh = list(steps)
    rnd.shuffle(sh)
    emit("shuffled", sh)
    perms = {}

    def relabel(i, rs):
        out = []
        for r in rs:
            key = (i // 8, r[3])
            if key not in perms:
                p = list(range(n_expert))
                rnd.shuffle(p)
                perms[key] = p
            out.append(r[:5] + [perms[key][r[5]]] + r[6:])
        return out

    emit("relabeled", steps, relabel)

    def mixed(i, rs):
        out, chosen = [], {}
        for r in rs:
            if r[3] % 2 == 0:
                out.append(r)
                continue
            c = chosen.setdefault(r[3], set())
            e = rnd.randrange(n_expert)
            while e in c:
                e = rnd.randrange(n_expert)
            c.add(e)
            out.append(r[:5] + [e] + r[6:])
        return out

    emit("mixed", steps, mixed)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3], sys.argv[4:] or MOE)
    elif len(sys.argv) == 4 and sys.argv[1] == "invert":
        invert(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
