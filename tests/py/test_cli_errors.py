#!/usr/bin/env python3
"""Bad input to the model commands: each case must exit non-zero with a message that names the
problem (and, where it helps, the fix), without a crash — run against the ASan/UBSan build.

usage: test_cli_errors.py TERRACE
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import synth  # noqa: E402

TERRACE = sys.argv[1]
from tally import check, verdict  # noqa: E402


def variant(path, drop=None, reshape=None, arch=None, drop_key=None):
    """a synthetic qwen2 model with one thing broken"""
    orig_add_tensor = gguf.GGUFWriter.add_tensor
    orig_add_kv = gguf.GGUFWriter.add_key_value
    orig_init = gguf.GGUFWriter.__init__

    def add_tensor(self, name, data, raw_dtype=None, **kw):
        if name == drop:
            return None
        if name == reshape:
            data = data[:-1] if data.ndim == 2 else data
        return orig_add_tensor(self, name, data, raw_dtype=raw_dtype, **kw)

    def add_key_value(self, key, val, vtype, *a, **kw):
        if drop_key and key == drop_key:
            return None
        return orig_add_kv(self, key, val, vtype, *a, **kw)

    def init(self, p, a, *rest, **kw):
        orig_init(self, p, arch or a, *rest, **kw)

    gguf.GGUFWriter.add_tensor, gguf.GGUFWriter.add_key_value = add_tensor, add_key_value
    gguf.GGUFWriter.__init__ = init
    try:
        synth.write("qwen2", "F32", path)
    finally:
        gguf.GGUFWriter.add_tensor, gguf.GGUFWriter.add_key_value = orig_add_tensor, orig_add_kv
        gguf.GGUFWriter.__init__ = orig_init


def run(args, stdin=None):
    env = dict(os.environ, ASAN_OPTIONS="exitcode=86", UBSAN_OPTIONS="exitcode=87")
    r = subprocess.run([TERRACE, *args], capture_output=True, text=True, env=env, input=stdin,
                       timeout=120, errors="replace")
    return r.returncode, r.stdout, r.stderr


def expect(name, args, rc, words, stdin=None):
    got_rc, out, err = run(args, stdin)
    missing = [w for w in words if w.lower() not in err.lower()]
    sanitizer = "Sanitizer" in err or "runtime error" in err
    check(got_rc == rc and not missing and not sanitizer,
          f"{name}: rc {got_rc} (want {rc}), missing {missing}: {err.strip()[:400]}")
    print(f"  {name:28s} rc={got_rc}  {err.strip().splitlines()[-1][:140] if err.strip() else ''}")


def main():
    with tempfile.TemporaryDirectory(prefix="terrace-cli-") as tmp:
        good = os.path.join(tmp, "good.gguf")
        synth.write("qwen2", "F32", good)
        p = lambda n: os.path.join(tmp, n)  # noqa: E731
        variant(p("no-attn-k.gguf"), drop="blk.1.attn_k.weight")
        variant(p("bad-shape.gguf"), reshape="blk.0.ffn_up.weight")
        variant(p("unknown-arch.gguf"), arch="mamba9")
        variant(p("no-heads.gguf"), drop_key="qwen2.attention.head_count")
        expect("missing tensor", ["run", "-m", p("no-attn-k.gguf"), "-p", "hi"], 1,
               ["missing tensor", "blk.1.attn_k.weight"])
        expect("wrong shape", ["run", "-m", p("bad-shape.gguf"), "-p", "hi"], 1,
               ["blk.0.ffn_up.weight", "shape", "expected"])
        expect("unknown architecture", ["run", "-m", p("unknown-arch.gguf"), "-p", "hi"], 1,
               ["mamba9", "not supported", "llama", "qwen2", "qwen3", "gemma3"])
        expect("missing hyperparameter", ["run", "-m", p("no-heads.gguf"), "-p", "hi"], 1,
               ["qwen2.attention.head_count"])
        expect("prompt longer than context", ["run", "-m", good, "-c", "8", "-p",
                                              "a b c d e f g h i j k l m n o p q r s t"], 1,
               ["prompt", "context", "-c"])
        expect("missing model file", ["run", "-m", p("nope.gguf"), "-p", "hi"], 1,
               ["nope.gguf", "cannot open"])
        expect("not a GGUF", ["run", "-m", __file__, "-p", "hi"], 1, ["not a GGUF file"])
        expect("unknown flag", ["run", "-m", good, "--frobnicate"], 2, ["unknown option", "--frobnicate"])
        expect("flag without value", ["run", "-m", good, "-p"], 2, ["needs a value"])
        expect("bad number", ["run", "-m", good, "-p", "x", "-n", "lots"], 2, ["-n", "lots"])
        expect("bad top-p", ["run", "-m", good, "-p", "x", "--top-p", "1.5"], 1, ["--top-p"])
        expect("bad thread count", ["run", "-m", good, "-p", "x", "-t", "0"], 2, ["-t"])
        expect("no model", ["run", "-p", "x"], 2, ["no model"])
        expect("bad --kv-tail", ["run", "-m", good, "-p", "x", "--kv-tail", "3"], 2,
               ["--kv-tail", "0, 4 or 8"])
        expect("bad --kv-tail-min", ["run", "-m", good, "-p", "x", "--kv-tail-min", "-1"], 2,
               ["--kv-tail-min"])
        expect("no agent at --csd-socket", ["run", "-m", good, "-p", "x", "-c", "256",
                                            "--kv-policy", "tiered", "--kv-hot", "64K", "--kv-cold",
                                            tmp, "--csd-socket", p("nobody.sock")], 1,
               ["cannot connect to", "nobody.sock", "terrace-storaged --listen"])
        expect("--kv-spec with --kv-tail", ["run", "-m", good, "-p", "x", "--kv-policy",
                                            "tiered", "--kv-spec", "--kv-tail", "4"], 1,
               ["--kv-spec", "--kv-tail"])
        expect("--kv-host-keys without the agent", ["run", "-m", good, "-p", "x", "-c", "256",
                                                    "--kv-policy", "tiered", "--kv-hot", "64K",
                                                    "--kv-cold", tmp, "--kv-host-keys", "64"], 2,
               ["--kv-host-keys", "needs the storage agent (--csd)"])
        expect("bad --kv-host-keys", ["run", "-m", good, "-p", "x", "--kv-host-keys", "0"], 2,
               ["--kv-host-keys"])
        expect("--kv-tail without tiered", ["run", "-m", good, "-p", "x", "--kv-policy", "quest",
                                            "--kv-tail", "4"], 2,
               ["--kv-tail applies to --kv-policy tiered", "the policy is quest"])
        expect("auto: budget too small", ["run", "-m", good, "-p", "x", "--mem-budget", "1M"], 1,
               ["kv cache auto", "the least --mem-budget for this context is", "lower -c"])
        expect("full over --mem-budget", ["run", "-m", good, "-p", "x", "-c", "2048", "--kv-policy",
                                          "full", "--mem-budget", "12M"], 1,
               ["--mem-budget 12.0 MiB cannot hold the plan", "the least --mem-budget for it is",
                "--kv-policy auto"])
        # the plan, printed before anything is allocated: with room the KV is full, in a tight
        # budget it spills to a cold pool; inspect --plan is run --dry-run. The tight budget is the
        # least one the refusal above names for this context, so the test follows the kernels'
        # scratch and the KV's layout. The model for it holds a context whose full KV (18 MiB)
        # is far more than its least tiered plan: the process's own pages, which the plan counts,
        # differ by some MiB between machines and runs (transparent huge pages, libraries), and a
        # small KV would let the full plan fit at the least budget.
        ctx0, synth.CTX = synth.CTX, 16384
        synth.write("qwen2", "F32", p("long.gguf"))
        synth.CTX = ctx0
        plan = ["-m", p("long.gguf"), "-c", "16384"]
        rc, out, err = run(["run", "--dry-run", *plan, "--mem-budget", "1M"])
        least = re.search(r"the least --mem-budget for this context is ([0-9.]+) MiB", err)
        check(rc == 1 and least, f"dry-run at 1M names no least budget: rc {rc}: {out}{err}")
        tight = f"{least.group(1)}M" if least else "48M"
        for cmd in (["run", "--dry-run"], ["inspect", "--plan"]):
            for budget in ("256M", tight):
                rc, out, err = run([*cmd, *plan, "--mem-budget", budget])
                mib = float(budget[:-1])
                want = [f"budget {mib:.1f} MiB (--mem-budget)", "weights", "expert cache", "scratch",
                        "margin", "experts left on storage"]
                kv = re.search(r"KV ([0-9.]+) MiB \(full\)", out)
                if budget == "256M":  # the whole KV in DRAM, as much as the full plan says
                    want += ["(full)", f"hot in DRAM {kv.group(1)} MiB" if kv else "KV (full)"]
                else:
                    want += ["(tiered)", "cold pool on storage"]
                missing = [w for w in want if w not in out]
                check(rc == 0 and not missing and "OVER" not in out,
                      f"{' '.join(cmd)} --mem-budget {budget}: rc {rc}, missing {missing}: {out}{err}")
                print(f"  {' '.join(cmd)} {budget:8s} rc={rc}  {out.strip().splitlines()[0][:120] if out.strip() else err[:120]}")
        # auto spills past its share (--kv-hot) into $XDG_CACHE_HOME/terrace and says so; the
        # cold pool's files go at exit
        os.environ["XDG_CACHE_HOME"] = p("xdg")
        expect("auto spills and says so", ["run", "-m", good, "-p", "x y z", "-n", "2", "-c", "2048",
                                           "--kv-hot", "1500K"], 0,
               ["kv cache auto", "tiered", p("xdg/terrace"), "removed at exit"])
        check(os.listdir(p("xdg/terrace")) == [], "auto left files in its cold directory")
        del os.environ["XDG_CACHE_HOME"]
        expect("no prompt", ["run", "-m", good], 2, ["no prompt"])
        expect("unknown command", ["frobnicate"], 2, ["unknown command"])
        expect("chat: no template", ["chat", "-m", good, "-p", "hi"], 1, ["--chat-template"])
        expect("chat: bad template name", ["chat", "-m", good, "-p", "hi", "--chat-template",
                                           "nonesuch"], 1, ["--chat-template"])
        expect("perplexity: text too short", ["perplexity", "-m", good, "-p", "short text",
                                              "-c", "64"], 1, ["tokens", "2 * c"])
        expect("bench: context too big", ["bench", "-m", good, "-p", "99999999"], 2, ["-p"])
        expect("logits: --tail too long", ["logits", "-m", good, "--tokens", "1,2", "--tail", "8"],
               2, ["--tail", "more than 8 tokens"])
        expect("logits: --tokens @missing", ["logits", "-m", good, "--tokens", "@" + p("none"),
                                             "--tail", "1"], 1, ["cannot read"])
        # MoE: a budget below one layer's top-k; an I/O error while reading an expert
        moe = p("moe.gguf")
        synth.write("qwen3moe", "Q8_0", moe)
        expect("expert budget too small", ["run", "-m", moe, "-p", "hi", "--expert-cache", "64K"],
               1, ["expert cache", "minimum"])
        expect("bad expert budget", ["run", "-m", moe, "-p", "hi", "--expert-cache", "lots"], 2,
               ["--expert-cache"])
        expect("bad experts mode", ["run", "-m", moe, "-p", "hi", "--experts", "disk"], 2,
               ["--experts"])
        expect("unknown policy", ["run", "-m", moe, "-p", "hi", "--expert-policy", "magic"], 1,
               ["magic"])
        os.environ["TERRACE_FAULT_READ"] = "2"
        expect("EIO reading an expert", ["run", "-m", moe, "-p", "hello there", "-n", "8"], 1,
               ["read error", "expert"])
        del os.environ["TERRACE_FAULT_READ"]
        # and the good model works end to end through every command
        rc, out, err = run(["run", "-m", good, "-p", "hello", "-n", "4", "--temp", "0"])
        check(rc == 0 and "tok/s" in err, f"run on the good model: rc {rc} {err[-300:]}")
        rc, out, err = run(["chat", "-m", good, "-p", "hello", "-n", "4", "--chat-template",
                            "chatml"], stdin="")
        check(rc == 0, f"chat on the good model: rc {rc} {err[-300:]}")
        rc, out, err = run(["bench", "-m", good, "-p", "16", "-n", "4", "-r", "1", "--json"])
        check(rc == 0 and '"test": "pp16"' in out, f"bench: rc {rc} {out} {err[-300:]}")
    return verdict("test_cli_errors")


if __name__ == "__main__":
    sys.exit(main())
