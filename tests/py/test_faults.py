#!/usr/bin/env python3
"""Hostile model files and faults through the model commands, as an attacker or an unlucky user
would meet them: each must end with a message that names the problem, an exit status of 1..127
(2 for flags that do not apply), no sanitizer report and no hang — never wrong text, a crash or
lost output with success. Run against the ASan/UBSan build.

Files are generated here from the synthetic models (tests/py/synth.py) and the default model,
changed byte by byte with tests/py/ggufedit.py. Cases where the file is accepted with a warning
(the leniencies llama.cpp has) assert the warning and exit 0.

usage: test_faults.py TERRACE DEFAULT_MODEL.gguf
"""
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ggufedit as E  # noqa: E402
import synth  # noqa: E402

TERRACE, DEFAULT = sys.argv[1], sys.argv[2]
failures = 0
ENV = dict(os.environ, ASAN_OPTIONS="exitcode=86:detect_leaks=1",
           UBSAN_OPTIONS="exitcode=87:print_stacktrace=1")


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {msg}", file=sys.stderr)


def run(args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=120):
    try:
        r = subprocess.run([TERRACE, *args], stdout=stdout, stderr=subprocess.PIPE, stdin=stdin,
                           env=ENV, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, b"", "TIMEOUT (hang)"
    return r.returncode, r.stdout or b"", r.stderr.decode("utf-8", "replace")


def sanitizer(err):
    return "Sanitizer" in err or "runtime error" in err


def last_line(err):
    lines = [x for x in err.strip().splitlines() if x.startswith("terrace: ")]
    return lines[-1] if lines else err.strip()[-200:]


def expect(name, args, words, rc=1, stdout=subprocess.PIPE, absent=(), timeout=120):
    """an error: exit status rc (1..127), every word in the message, no sanitizer report"""
    got, out, err = run(args, stdout=stdout, timeout=timeout)
    low = err.lower()
    missing = [w for w in words if w.lower() not in low]
    present = [w for w in absent if w in err]
    check(got == rc and 0 < got < 128 and not missing and not present and not sanitizer(err),
          f"{name}: rc {got} (want {rc}), missing {missing}, unwanted {present}: {err.strip()[-500:]}")
    print(f"  {name:44s} rc={got}  {last_line(err)[:150]}")
    return err


def expect_ok(name, args, words=(), stdout=subprocess.PIPE):
    """accepted (exit 0), with the warning words on stderr"""
    got, out, err = run(args, stdout=stdout)
    missing = [w for w in words if w.lower() not in err.lower()]
    check(got == 0 and not missing and not sanitizer(err),
          f"{name}: rc {got}, missing {missing}: {err.strip()[-500:]}")
    warn = [x for x in err.splitlines() if "warning" in x]
    print(f"  {name:44s} rc={got}  {(warn[0] if warn else '')[:150]}")
    return out, err


def edit(src, dst, fn, **kw):
    g = E.GGUF.read(src)
    fn(g)
    g.write(dst, **kw)
    return dst


def nan_scales(data, block_bytes, at=0, value=b"\x00\x7e"):
    """every block's f16 scale at byte `at` set to `value` (NaN by default)"""
    a = np.frombuffer(data, np.uint8).copy()
    a = a[: len(a) // block_bytes * block_bytes].reshape(-1, block_bytes)
    a[:, at:at + 2] = np.frombuffer(value, np.uint8)
    return a.tobytes()


def f32_all(data, value):
    a = np.frombuffer(data, np.float32).copy()
    a[:] = value
    return a.tobytes()


def set_tensor(name, fn):
    def f(g):
        t = g.tensor(name)
        t.data = fn(t.data[:E.tensor_bytes(t)])
    return f


PROMPT = "The capital of France is"
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="terrace-faults-") as tmp:
        p = lambda n: os.path.join(tmp, n)  # noqa: E731
        dense, moe, f16 = p("dense.gguf"), p("moe.gguf"), p("f16.gguf")
        synth.write("qwen2", "Q8_0", dense)
        synth.write("qwen3moe", "Q8_0", moe)
        synth.write("gemma3", "F16", f16)
        n_vocab = synth.N_VOCAB

        print("silent wrong output")
        def vocab(n):
            def f(g):
                et, toks = g.get("tokenizer.ggml.tokens")
                ty = g.get("tokenizer.ggml.token_type")[1]
                toks = toks[:n] + [f"<pad_{i}>".encode() for i in range(n - len(toks))]
                ty = ty[:n] + [1] * (n - len(ty))
                g.set("tokenizer.ggml.tokens", E.ARR, (E.STR, toks))
                g.set("tokenizer.ggml.token_type", E.ARR, (E.I32, ty))
                g.set("tokenizer.ggml.bos_token_id", E.U32, n - 2)
                g.set("tokenizer.ggml.eos_token_id", E.U32, n - 1)
            return f
        expect("vocabulary smaller than the embeddings",
               ["run", "-m", edit(dense, p("v-small.gguf"), vocab(1000)), "-p", "hi"],
               ["1000 tokens", "tokenizer.ggml.tokens", f"{n_vocab} rows", "token_embd.weight"])
        expect("vocabulary larger than the embeddings",
               ["run", "-m", edit(dense, p("v-big.gguf"), vocab(1030)), "-p", "hi"],
               ["1030 tokens", f"{n_vocab} rows"])
        def out_rows(g):
            t = g.tensor("output.weight")
            t.dims = [t.dims[0], t.dims[1] - 32]
            t.data = t.data[:E.tensor_bytes(t)]
        expect("output rows other than the vocabulary",
               ["run", "-m", edit(dense, p("out-rows.gguf"), out_rows), "-p", "hi"],
               ["output.weight", f"{n_vocab - 32} rows", f"has {n_vocab}"])

        nonfinite = ["non-finite", "NaN or Inf", "corrupt"]
        f = edit(DEFAULT, p("nan-norm.gguf"),
                 set_tensor("output_norm.weight", lambda d: struct.pack("<f", float("nan")) + d[4:]))
        expect("NaN in the output norm (default model)", ["run", "-m", f, "-p", PROMPT, "--temp", "0"],
               nonfinite + ["output_norm.weight"])
        expect("NaN in the output norm: perplexity", ["perplexity", "-m", f, "-p", LONG, "-c", "32"],
               nonfinite + ["output_norm.weight"], absent=["PPL = nan"])
        q41 = 20  # Q4_1 block: d, m, 16 bytes
        f = edit(DEFAULT, p("nan-q41.gguf"), set_tensor("blk.3.attn_q.weight",
                                                        lambda d: nan_scales(d, q41)))
        expect("NaN Q4_1 scales (default model)", ["run", "-m", f, "-p", PROMPT, "--temp", "0"],
               nonfinite + ["layer 3", "blk.3.attn"])
        f = edit(DEFAULT, p("inf-q41.gguf"), set_tensor("blk.3.attn_q.weight",
                                                        lambda d: nan_scales(d, q41, 0, b"\x00\x7c")))
        expect("Inf Q4_1 scales (default model)", ["run", "-m", f, "-p", PROMPT, "--temp", "0"],
               nonfinite + ["layer 3"])
        f = edit(dense, p("nan-embd.gguf"), set_tensor("token_embd.weight",
                                                       lambda d: nan_scales(d, 34)))
        expect("NaN embeddings", ["run", "-m", f, "-p", PROMPT], nonfinite + ["token_embd.weight"])
        f = edit(dense, p("nan-down.gguf"), set_tensor("blk.1.ffn_down.weight",
                                                       lambda d: nan_scales(d, 34)))
        expect("NaN FFN weights", ["run", "-m", f, "-p", PROMPT], nonfinite + ["layer 1", "blk.1.ffn"])
        f = edit(moe, p("nan-exps.gguf"), set_tensor("blk.1.ffn_up_exps.weight",
                                                     lambda d: nan_scales(d, 34)))
        expect("NaN experts (expert cache)", ["run", "-m", f, "-p", PROMPT],
               nonfinite + ["layer 1", "expert", "ffn_up_exps"])
        expect("NaN experts (--experts mmap)", ["run", "-m", f, "-p", PROMPT, "--experts", "mmap"],
               nonfinite + ["layer 1", "expert"])
        f = edit(moe, p("nan-router.gguf"), set_tensor("blk.0.ffn_gate_inp.weight",
                                                       lambda d: f32_all(d, float("nan"))))
        expect("NaN router", ["run", "-m", f, "-p", PROMPT], nonfinite + ["router", "blk.0.ffn_gate_inp"])

        def special(key, v):
            return lambda g: g.set(key, E.U32, v)
        expect_ok("BOS id out of range: warned",
                  ["run", "-m", edit(dense, p("bos.gguf"), special("tokenizer.ggml.bos_token_id", 5000)),
                   "-p", "hi", "-n", "1"],
                  ["warning", "tokenizer.ggml.bos_token_id = 5000", "outside the vocabulary"])
        expect_ok("EOS id out of range: warned",
                  ["run", "-m", edit(dense, p("eos.gguf"), special("tokenizer.ggml.eos_token_id", 1 << 30)),
                   "-p", "hi", "-n", "1"],
                  ["warning", "tokenizer.ggml.eos_token_id", "outside the vocabulary"])
        def bad_type(g):
            ty = g.get("tokenizer.ggml.token_type")[1]
            ty[300] = 77
            g.set("tokenizer.ggml.token_type", E.ARR, (E.I32, ty))
        err = expect("token type outside the enum",
                     ["run", "-m", edit(dense, p("type.gguf"), bad_type), "-p", "hi"],
                     ["tokenizer.ggml.token_type[300] = 77", "not a token type"])
        check(err.count("tokenizer:") == 1, f"'tokenizer:' repeated: {err.strip()}")
        def bad_merge(g):
            g.set("tokenizer.ggml.merges", E.ARR, (E.STR, [b"\xc4\xa0 t", b"a", b"bc "]))
        expect_ok("malformed merges: warned",
                  ["run", "-m", edit(dense, p("merge.gguf"), bad_merge), "-p", "hi", "-n", "1"],
                  ["warning", "tokenizer.ggml.merges", "2 of 3 merges", "ignored"])
        def no_bytes(g):
            toks = g.get("tokenizer.ggml.tokens")[1]
            toks = [t if len(t.decode()) > 1 else b"<b_%d>" % i for i, t in enumerate(toks)]
            g.set("tokenizer.ggml.tokens", E.ARR, (E.STR, toks))
        expect("byte-level BPE without byte tokens",
               ["run", "-m", edit(dense, p("nobytes.gguf"), no_bytes), "-p", "hi"],
               ["none of the 256 byte tokens", "tokenizer.ggml.tokens"])
        with open(p("ctl.txt"), "wb") as fh:
            fh.write(b"one \x04 two")
        expect_ok("characters without a token: warned",
                  ["run", "-m", DEFAULT, "-f", p("ctl.txt"), "-n", "1", "--temp", "0"],
                  ["warning", "1 character", "0x04", "left out"])
        expect("general.architecture with a NUL",
               ["run", "-m", edit(dense, p("nul.gguf"),
                                  lambda g: g.set("general.architecture", E.STR, b"qwen2\0x")),
                "-p", "hi"], ["general.architecture", "NUL"])

        print("undefined behaviour: general.alignment = 1, every tensor at an odd byte")
        for label, src, extra in (("default model, mapped", DEFAULT, []),
                                  ("default model, --no-mmap", DEFAULT, ["--no-mmap"]),
                                  ("MoE, expert cache", moe, []),
                                  ("MoE, --experts mmap", moe, ["--experts", "mmap"]),
                                  ("F16 gemma3 (sliding window)", f16, [])):
            odd = p("odd-" + os.path.basename(src))
            if not os.path.exists(odd):
                edit(src, odd, lambda g: None, odd_offsets=True)
            args = ["-p", PROMPT, "-n", "6", "--temp", "0", "--no-display-prompt", *extra]
            want_rc, want, e1 = run(["run", "-m", src, *args])
            got_rc, got, e2 = run(["run", "-m", odd, *args])
            check(want_rc == 0 and got_rc == 0 and got == want and not sanitizer(e1 + e2),
                  f"odd offsets, {label}: rc {want_rc}/{got_rc}, {want!r} vs {got!r}: {e2[-400:]}")
            print(f"  odd offsets, {label:32s} rc={got_rc}  same text: {got == want}  {got[:40]!r}")

        print("crashes and hangs")
        for label, src, extra in (("mapped", dense, []), ("--experts mmap", moe, ["--experts", "mmap"])):
            victim = p("victim.gguf")
            with open(src, "rb") as a, open(victim, "wb") as b:
                b.write(a.read())
            proc = subprocess.Popen([TERRACE, "run", "-m", victim, "-p", "hello", "-n", "100000",
                                     "--ignore-eos", "-c", "2048", *extra],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
            proc.stdout.read(64)  # generating: the weights are mapped and in use
            os.truncate(victim, os.path.getsize(victim) // 2)
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            err = err.decode("utf-8", "replace")
            ok = proc.returncode == 1 and "changed or was truncated while in use" in err and \
                victim in err and not sanitizer(err)
            check(ok, f"truncated while {label}: rc {proc.returncode}: {err[-400:]}")
            print(f"  {'file truncated while ' + label:44s} rc={proc.returncode}  {last_line(err)[:150]}")
        fifo = p("model.fifo")
        os.mkfifo(fifo)
        expect("-m FIFO", ["run", "-m", fifo, "-p", "hi"], ["model.fifo", "FIFO", "regular file"],
               timeout=20)
        expect("-m /dev/zero", ["run", "-m", "/dev/zero", "-p", "hi"], ["character device"], timeout=20)
        expect("-f /dev/zero", ["run", "-m", dense, "-f", "/dev/zero", "-c", "64"],
               ["/dev/zero", "bytes", "context of 64 tokens", "-c"], timeout=30)
        with open(p("big.txt"), "w") as fh:
            fh.write("x" * 200000)
        expect("-f larger than the context can hold", ["run", "-m", dense, "-f", p("big.txt"), "-c", "64"],
               ["big.txt", "200000 bytes", "context of 64 tokens"])

        print("lost output")
        with open("/dev/full", "wb") as full:
            expect("run > /dev/full", ["run", "-m", dense, "-p", "hi", "-n", "4"],
                   ["cannot write", "standard output", "No space left"], stdout=full)
            expect("run --no-display-prompt > /dev/full", ["run", "-m", dense, "-p", "hi", "-n", "4",
                                                           "--no-display-prompt", "--ignore-eos"],
                   ["cannot write", "No space left"], stdout=full)
            expect("inspect > /dev/full", ["inspect", dense], ["No space left"], stdout=full)
            expect("bench > /dev/full", ["bench", "-m", dense, "-p", "8", "-n", "4", "-r", "1"],
                   ["standard output", "No space left"], stdout=full)
            expect("perplexity > /dev/full", ["perplexity", "-m", dense, "-p", LONG, "-c", "32"],
                   ["standard output", "No space left"], stdout=full)
        expect("--telemetry /dev/full", ["run", "-m", dense, "-p", "hi", "-n", "64", "--ignore-eos",
                                         "--telemetry", "/dev/full"],
               ["telemetry file /dev/full", "No space left"])
        expect("--route-trace /dev/full", ["run", "-m", moe, "-p", "hello there", "-n", "8",
                                           "--route-trace", "/dev/full"],
               ["route trace /dev/full", "No space left"])
        expect("--telemetry into a directory", ["run", "-m", dense, "-p", "hi", "-n", "2",
                                                "--telemetry", tmp], ["telemetry file", "directory"])

        print("accepted without a word")
        expect("--mem-budget 1K", ["run", "-m", moe, "-p", "hi", "--mem-budget", "1K"],
               ["--mem-budget 1.0 KiB", "below the least", "dense weights", "smallest session",
                "smallest expert cache"])
        expect_ok("-c beyond the training context: warned", ["run", "-m", dense, "-p", "hi", "-n", "1",
                                                             "-c", "100000"],
                  ["warning", "100000 tokens", f"{synth.CTX}", "trained", "MiB"])
        expect("--expert-cache 0", ["run", "-m", moe, "-p", "hi", "--expert-cache", "0"],
               ["--expert-cache 0", "auto", "min"], rc=2)
        full = ["--kv-policy", "full"]
        for flags, words in (([*full, "--kv-cold", tmp], ["--kv-cold", "offload, h2o, quest, tiered or auto",
                                                          "the policy is full"]),
                             ([*full, "--kv-hot", "1G"], ["--kv-hot", "the policy is full"]),
                             ([*full, "--kv-alpha", "0.2"], ["--kv-alpha", "h2o, quest, tiered or auto"]),
                             ([*full, "--csd"], ["--csd", "tiered or auto", "the policy is full"]),
                             (["--csd"], ["--csd needs a cold pool"]),
                             (["--kv-keep"], ["--kv-keep needs --kv-cold"]),
                             (["--kv-policy", "offload", "--kv-alpha", "0.2"],
                              ["--kv-alpha", "the policy is offload"]),
                             (["--kv-policy", "h2o", "--kv-hot", "64K", "--kv-cold", tmp, "--csd"],
                              ["--csd", "tiered", "the policy is h2o"]),
                             (["--kv-policy", "tiered", "--csd"], ["--csd needs a cold pool"]),
                             (["--kv-policy", "tiered", "--kv-keep"], ["--kv-keep needs --kv-cold"]),
                             (["--kv-policy", "tiered", "--csd-chunk", "64"],
                              ["--csd-chunk needs the storage agent"]),
                             (["--kv-policy", "tiered", "--kv-tail-min", "2"],
                              ["--kv-tail-min needs --kv-tail"])):
            expect(" ".join(flags).replace(tmp, "DIR"), ["run", "-m", dense, "-p", "hi", *flags],
                   words, rc=2)
        for flag in (["--expert-cache", "1G"], ["--experts", "mmap"],
                     ["--expert-policy", "lru"], ["--route-trace", p("t.csv")]):
            expect(f"{flag[0]} on a dense model", ["run", "-m", dense, "-p", "hi", *flag],
                   [flag[0], "mixture-of-experts", "dense"], rc=2)
        expect("--expert-policy with --experts mmap", ["run", "-m", moe, "-p", "hi", "--experts",
                                                       "mmap", "--expert-policy", "lru"],
               ["--expert-policy", "--experts mmap"], rc=2)
        expect("-sys in run without a template", ["run", "-m", dense, "-p", "hi", "-sys", "be brief"],
               ["-sys", "--jinja", "--chat-template"], rc=2)
        expect("--reasoning-format in run", ["run", "-m", dense, "-p", "hi", "--reasoning-format",
                                             "none"], ["--reasoning-format", "terrace chat"], rc=2)
        expect("--chat-template in bench", ["bench", "-m", dense, "-p", "8", "-n", "2",
                                            "--chat-template", "chatml"],
               ["--chat-template", "terrace run", "terrace chat"], rc=2)
        expect("--chunks in run", ["run", "-m", dense, "-p", "hi", "--chunks", "2"],
               ["--chunks", "perplexity"], rc=2)

        print("unclear messages")
        expect("expert_count = 0",
               ["run", "-m", edit(moe, p("e0.gguf"), lambda g: g.set("qwen3moe.expert_count", E.U32, 0)),
                "-p", "hi"], ["blk.0.ffn_gate_inp.weight", "qwen3moe.expert_count is 0"],
               absent=["missing tensor"])
        expect("expert_count missing",
               ["run", "-m", edit(moe, p("e-.gguf"), lambda g: g.drop("qwen3moe.expert_count")),
                "-p", "hi"], ["qwen3moe.expert_count is missing"], absent=["missing tensor"])
        q3 = p("qwen3.gguf")
        synth.write("qwen3", "F32", q3)
        expect("odd head dimension, no rope key",
               ["run", "-m", edit(q3, p("odd-hd.gguf"),
                                  lambda g: g.set("qwen3.attention.key_length", E.U32, 63)),
                "-p", "hi"], ["key head dimension 63", "qwen3.attention.key_length", "odd"],
               absent=["rope.dimension_count"])
        # a split model whose second shard has no split keys
        s1, s2 = p("m-00001-of-00002.gguf"), p("m-00002-of-00002.gguf")
        def shard1(g):
            g.set("split.no", E.U16, 0)
            g.set("split.count", E.U16, 2)
        edit(dense, s1, shard1)
        edit(dense, s2, lambda g: None)
        expect("shard without split keys", ["run", "-m", s1, "-p", "hi"],
               ["m-00002-of-00002.gguf", "no split.no key"], absent=["-1 of -1"])
        esc = edit(dense, p("esc.gguf"), lambda g: (
            g.set("general.architecture", E.STR, b"\x1b]0;owned\x07\x1b[31mx\xc2\x9b"),
            g.set("general.name", E.STR, b"\x1b[2J"), g.set(b"x.\x1b[1mkey", E.U32, 1)))
        err = expect("control characters in an error", ["run", "-m", esc, "-p", "hi"],
                     ["not supported", "\\x1b]0;owned\\x07"], absent=["\x1b", "\x07", "\u009b"])
        got, out, err = run(["inspect", esc])
        shown = out.decode("utf-8", "replace")
        check(got == 0 and "\x1b" not in shown and "\x07" not in shown and "\u009b" not in shown
              and "\\x1b[2J" in shown and "x.\\x1b[1mkey" in shown and not sanitizer(err),
              f"inspect escapes control characters: rc {got}: {shown[:600]!r}")
        print(f"  {'control characters in inspect':44s} rc={got}  escaped: {chr(27) not in shown}")
    print(f"test_faults: {time.time() - t0:.0f} s, " +
          ("all checks passed" if not failures else f"{failures} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
