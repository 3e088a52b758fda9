#!/usr/bin/env python3
"""`terrace chat` with the synthetic MoE models (gpt-oss, phimoe, qwen3moe) and a qwen2
DeepSeek-R1-distill style model, each carrying its family's real chat template
(tests/py/synth.py --chat: weights that make greedy decoding write a fixed reply in the family's
format). For each model:
- `terrace template -m` renders the model's own template exactly as jinja2 does (HF's env);
- `terrace chat -p Hi </dev/null` names the model's template, prints the answer alone on stdout
  and the reasoning apart on stderr (harmony analysis channel, Qwen3 <think>, R1's open <think>);
- `--reasoning-format none` prints the reply as written;
- `terrace run --jinja` formats -p with the template;
then a two-turn piped chat with gpt-oss (its template refuses harmony markers in the history,
so the history must hold the answer only), a file without a template (the error names
--chat-template), --chat-template FILE.jinja and a name that is neither.

usage: test_chat_templates.py TERRACE TEMPLATES_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import jinja_ref  # noqa: E402
import synth  # noqa: E402

NOW = "2025-01-15T12:00:00"
EXPECT = {  # arch: (family named by chat, reasoning on stderr, answer on stdout)
    "gpt-oss": ("gpt-oss", "The user said hi.", "Hello!"),
    "qwen3moe": ("chatml", "The user greets me.", "Hello! How can I help?"),
    "qwen2": ("deepseek3", "Okay, the user says hi.", "Hi there!"),
    "phimoe": ("phi3", None, "Hello! I am a test model."),
}


def bytes_text(tokens):
    """the text of byte-level BPE token strings"""
    inv = {c: b for b, c in zip(range(256), byte_alphabet())}
    out = bytearray()
    for t in tokens:
        for ch in t:
            out += bytes([inv[ch]]) if ch in inv else ch.encode()
    return out.decode()


def byte_alphabet():
    """GPT-2's byte -> character table, in byte order"""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", **kw)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    terrace, tdir = argv[1], argv[2]
    failures = 0

    def check(ok, what, detail=""):
        nonlocal failures
        print(("ok   " if ok else "FAIL ") + what + ("" if ok else f"\n     {detail}"))
        failures += 0 if ok else 1

    with tempfile.TemporaryDirectory() as tmp:
        hi = os.path.join(tmp, "hi.json")
        with open(hi, "w") as f:
            json.dump([{"role": "user", "content": "Hi"}], f)
        models = {}
        for arch in EXPECT:
            path = os.path.join(tmp, f"chat-{arch}.gguf")
            p = run([sys.executable, os.path.join(HERE, "synth.py"), arch, "F32", path, "--chat", tdir])
            check(p.returncode == 0, f"{arch}: synth.py --chat", p.stderr)
            models[arch] = path
        for arch, (family, reasoning, answer) in EXPECT.items():
            model, spec = models[arch], synth.CHAT_SPECS[arch]
            source = open(os.path.join(tdir, spec["template"]), encoding="utf-8").read()
            want = jinja_ref.render(source, [{"role": "user", "content": "Hi"}], True, spec["bos"], spec["eos"],
                                    None, datetime.fromisoformat(NOW))
            p = run([terrace, "template", "-m", model, "--messages", hi, "--now", NOW])
            check(want[0] == "ok" and p.returncode == 0 and p.stdout == want[1],
                  f"{arch}: terrace template -m renders the model's template as jinja2 does",
                  f"jinja2 {want!r}\n     terrace {p.stdout!r} {p.stderr!r}")

            p = run([terrace, "chat", "-m", model, "-p", "Hi", "--temp", "0", "-n", "64"], stdin=subprocess.DEVNULL)
            check(p.returncode == 0, f"{arch}: chat exits 0", p.stderr)
            check(f"chat template {family} (the model's Jinja template)" in p.stderr,
                  f"{arch}: chat uses the model's own template ({family})", p.stderr[:300])
            check(p.stdout == answer + "\n", f"{arch}: the answer alone on stdout: {answer!r}", repr(p.stdout))
            if reasoning:
                check(reasoning in p.stderr and reasoning not in p.stdout,
                      f"{arch}: the reasoning apart, on stderr: {reasoning!r}", p.stderr[:400])

            # what the model writes, its end-of-generation token excluded (R1's reply has no
            # <think>: its template opened it in the prompt)
            raw = bytes_text(t for t in spec["reply"][:-1])
            p = run([terrace, "chat", "-m", model, "-p", "Hi", "--temp", "0", "-n", "64", "--reasoning-format", "none"],
                    stdin=subprocess.DEVNULL)
            check(p.returncode == 0 and p.stdout == raw + "\n", f"{arch}: --reasoning-format none prints the reply as written",
                  f"want {raw!r} got {p.stdout!r} {p.stderr[-300:]!r}")

            p = run([terrace, "run", "-m", model, "-p", "Hi", "--jinja", "--temp", "0", "-n", "64", "--no-display-prompt"])
            check(p.returncode == 0 and p.stdout == raw + "\n", f"{arch}: run --jinja formats the prompt with the template",
                  f"want {raw!r} got {p.stdout!r}")

        # two turns: the history holds the answers only (gpt-oss's template raises on markers there)
        p = run([terrace, "chat", "-m", models["gpt-oss"], "--temp", "0", "-n", "64"], input="Hi\nHi again\n")
        check(p.returncode == 0 and p.stdout == "Hello!\nHello!\n" and p.stderr.count("The user said hi.") == 2,
              "gpt-oss: a two-turn chat (the history keeps the answers, not the channels)",
              f"{p.stdout!r} {p.stderr[-500:]!r}")

        plain = os.path.join(tmp, "plain.gguf")
        run([sys.executable, os.path.join(HERE, "synth.py"), "phimoe", "F32", plain])
        p = run([terrace, "chat", "-m", plain, "-p", "Hi"], stdin=subprocess.DEVNULL)
        check(p.returncode == 1 and "--chat-template" in p.stderr, "a file without a template: the error names --chat-template",
              p.stderr[-300:])
        p = run([terrace, "chat", "-m", plain, "-p", "Hi", "--temp", "0", "-n", "4",
                 "--chat-template", os.path.join(tdir, "chatml.jinja")], stdin=subprocess.DEVNULL)
        check(p.returncode == 0 and "chat template chatml.jinja" in p.stderr, "--chat-template FILE.jinja", p.stderr[-300:])
        p = run([terrace, "chat", "-m", plain, "-p", "Hi", "--chat-template", "nosuch"], stdin=subprocess.DEVNULL)
        check(p.returncode == 1 and "not a built-in format" in p.stderr, "--chat-template NAME that is neither: an error",
              p.stderr[-300:])
        p = run([terrace, "chat", "-m", plain, "-p", "Hi", "--temp", "0", "-n", "4", "--chat-template", "llama3"],
                stdin=subprocess.DEVNULL)
        check(p.returncode == 0 and "chat template llama3" in p.stderr, "--chat-template llama3 (a built-in format)",
              p.stderr[-300:])
    print("test_chat_templates: " + ("all checks passed" if not failures else f"{failures} check(s) FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
