#!/usr/bin/env python3
"""Every KV policy's logits, bit for bit, against stored digests: on synthetic models of each
attention shape — MHA (olmoe: 4 heads, 4 KV heads), GQA (qwen2: 4 / 2), MQA (gemma3: 4 / 1, with
sliding-window layers) — and on the default model, for every policy at alpha 1 and alpha 0.2,
hot and with a cold pool, and tiered with each of its options (4-bit scoring, the tail estimate,
speculation, placement, the storage agent, a fixed split, the host key ring). At alpha 1 every
pooled policy (hot or cold) computes its prefill with the full policy's attention kernel over the
gathered rows, so its logits must equal full's bit for bit (checked apart). The digests were
recorded with a reference build and the same kernel family; a change to the KV cache's code that
is meant to keep its numbers must keep them all.

usage: test_kv_logits.py check TERRACE DEFAULT_MODEL.gguf REF.json
       test_kv_logits.py record TERRACE DEFAULT_MODEL.gguf REF.json [ISA ...]   (default: every
                         kernel family the CPU has)
The default model's token ids are stored with the digests (a tokenizer change does not move them).
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import synth  # noqa: E402

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, "
        "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
        "the face of the waters. And God said, Let there be light: and there was light. And God "
        "saw the light, that it was good: and God divided the light from the darkness.")
SEL = ["--kv-window", "16", "--kv-sink", "4"]


def configs(cold):
    """(name, flags) of every configuration, cold: the cold-pool directory"""
    c = ["--kv-hot", "64K", "--kv-cold", cold]
    out = [("full", [])]
    for pol in ("offload", "h2o", "quest", "tiered"):
        out.append((f"{pol} a1 hot", ["--kv-policy", pol, "--kv-alpha", "1"]))
        out.append((f"{pol} a1 cold", ["--kv-policy", pol, "--kv-alpha", "1", *c]))
        if pol != "offload":
            out.append((f"{pol} a0.2 hot", ["--kv-policy", pol, "--kv-alpha", "0.2", *SEL]))
            out.append((f"{pol} a0.2 cold", ["--kv-policy", pol, "--kv-alpha", "0.2", *SEL, *c]))
    t = ["--kv-policy", "tiered", "--kv-alpha", "0.2", *SEL]
    for name, extra in (("bits4", ["--kv-score-bits", "4"]), ("tail4", ["--kv-tail", "4"]),
                        ("tail8 min0", ["--kv-tail", "8", "--kv-tail-min", "0"])):
        out.append((f"tiered a0.2 hot {name}", t + extra))
    for name, extra in (("spec", ["--kv-spec"]), ("bkp on", ["--kv-bkp", "on"]),
                        ("bkp naive", ["--kv-bkp", "naive"]), ("beta 0.5", ["--kv-beta", "0.5"]),
                        ("csd", ["--csd"]), ("csd spec bkp", ["--csd", "--kv-spec", "--kv-bkp", "on"]),
                        ("csd host-keys b8", ["--csd", "--kv-host-keys", "40", "-b", "8"]),
                        ("spec b8", ["--kv-spec", "-b", "8"])):
        out.append((f"tiered a0.2 cold {name}", t + c + extra))
    return out


def real_configs(cold):
    c = ["--kv-hot", "1M", "--kv-cold", cold]
    out = [("full", [])]
    for pol in ("offload", "h2o", "quest", "tiered"):
        out.append((f"{pol} a1", ["--kv-policy", pol, "--kv-alpha", "1"]))
        if pol != "offload":
            out.append((f"{pol} a0.2", ["--kv-policy", pol, "--kv-alpha", "0.2", *SEL]))
    t = ["--kv-policy", "tiered", "--kv-alpha", "0.2", *SEL]
    out.append(("tiered a0.2 tail4", t + ["--kv-tail", "4"]))
    out.append(("tiered a0.2 cold csd spec bkp", t + c + ["--csd", "--kv-spec", "--kv-bkp", "on"]))
    return out


def run_logits(terrace, model, toks, extra, out, isa):
    env = dict(os.environ, TERRACE_ISA=isa)
    r = subprocess.run([terrace, "logits", "-m", model, "--tokens", ",".join(map(str, toks)),
                        "--out", out, "-b", "64", *extra], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        return None, r.stderr.strip()
    data = open(out, "rb").read()
    x = np.frombuffer(data, dtype=np.float32).reshape(len(toks), -1)
    return {"sha256": hashlib.sha256(data).hexdigest(),
            "argmax": [int(v) for v in x.argmax(1)],
            "rowsum": [float(v) for v in x.astype(np.float64).sum(1)]}, ""


def prompt_tokens(terrace, model):
    r = subprocess.run([terrace, "run", "-m", model, "-p", TEXT, "-n", "0", "--verbose",
                        "--no-display-prompt"], capture_output=True, text=True)
    return [int(x) for line in r.stderr.splitlines() if line.startswith("terrace: prompt tokens")
            for x in line.split(":", 2)[2].split()]


def cpu_isas(terrace):
    r = subprocess.run([terrace, "--version"], capture_output=True, text=True)
    best = r.stdout.split("kernels: ")[-1].strip(" )\n")
    order = ["scalar", "avx2", "avx512"]
    return order[: order.index(best) + 1] if best in order else ["scalar"]


def compute(terrace, real, tmp, isa, real_toks):
    """{model: {config: result}} for one kernel family; errors as strings"""
    cold = os.path.join(tmp, "cold")
    os.makedirs(cold, exist_ok=True)
    res = {}
    toks = synth.token_sequence(160)
    for arch in ("olmoe", "qwen2", "gemma3"):
        path = os.path.join(tmp, arch + ".gguf")
        if not os.path.exists(path):
            synth.write(arch, "F32", path)
        res[arch] = {}
        for name, flags in configs(cold):
            got, e = run_logits(terrace, path, toks, flags, os.path.join(tmp, "l.f32"), isa)
            res[arch][name] = got if got is not None else "error: " + e
    if real:
        res["default"] = {}
        for name, flags in real_configs(cold):
            got, e = run_logits(terrace, real, real_toks, flags, os.path.join(tmp, "l.f32"), isa)
            res["default"][name] = got if got is not None else "error: " + e
    return res


def main():
    mode, terrace, real, ref = sys.argv[1:5]
    if not os.path.exists(real):
        real = None
    with tempfile.TemporaryDirectory(prefix="terrace-kvlog-") as tmp:
        if mode == "record":
            isas = sys.argv[5:] or cpu_isas(terrace)
            real_toks = prompt_tokens(terrace, real) if real else []
            doc = {"terrace": subprocess.run([terrace, "--version"], capture_output=True,
                                             text=True).stdout.strip(),
                   "default_tokens": real_toks, "isa": {}}
            for isa in isas:
                doc["isa"][isa] = compute(terrace, real, tmp, isa, real_toks)
                bad = [(m, c, v) for m, cs in doc["isa"][isa].items() for c, v in cs.items()
                       if isinstance(v, str)]
                for m, c, v in bad:
                    print(f"record: {isa} {m} {c}: {v}", file=sys.stderr)
                if bad:
                    return 1
            json.dump(doc, open(ref, "w"), indent=1)
            print(f"recorded {sum(len(c) for m in doc['isa'].values() for c in m.values())} "
                  f"digests ({', '.join(isas)}) in {ref}")
            return 0
        doc = json.load(open(ref))
        isas = [i for i in cpu_isas(terrace) if i in doc["isa"]]
        # the best family this CPU has, and the scalar reference kernels
        isas = sorted({isas[-1], "scalar"} & set(isas), key=["scalar", "avx2", "avx512"].index)
        failures = checked = 0
        for isa in isas:
            want = doc["isa"][isa]
            got = compute(terrace, real if "default" in want else None, tmp, isa,
                          doc["default_tokens"])
            for model, cs in want.items():
                same = 0
                for name, w in cs.items():
                    g = got.get(model, {}).get(name)
                    checked += 1
                    if isinstance(g, dict) and g["sha256"] == w["sha256"]:
                        same += 1
                        continue
                    failures += 1
                    if not isinstance(g, dict):
                        print(f"FAIL {isa} {model} {name}: {g}", file=sys.stderr)
                        continue
                    rows = [i for i, (a, b) in enumerate(zip(g["rowsum"], w["rowsum"])) if a != b]
                    flips = sum(a != b for a, b in zip(g["argmax"], w["argmax"]))
                    print(f"FAIL {isa} {model} {name}: logits differ from the reference (first "
                          f"row {rows[0] if rows else '?'} of {len(rows)} rows; top-1 changed at "
                          f"{flips} positions)", file=sys.stderr)
                print(f"  {isa:7s} {model:8s} {same}/{len(cs)} configurations bit-identical")
                full = got.get(model, {}).get("full")
                for name, g in got.get(model, {}).items():
                    if " a1" not in name:
                        continue
                    checked += 1
                    if not (isinstance(g, dict) and isinstance(full, dict)
                            and g["sha256"] == full["sha256"]):
                        failures += 1
                        print(f"FAIL {isa} {model} {name}: alpha 1 differs from full's logits",
                              file=sys.stderr)
        print(f"test_kv_logits: {checked - failures}/{checked} bit-identical"
              + ("" if not failures else f", {failures} FAILED"))
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
