#!/usr/bin/env python3
"""`terrace chat` driven through a pseudo-terminal, as a person types into it: the commands,
multi-line input, /save and /load, Ctrl-C during a reply (back to the prompt) and at the prompt
(exit 130 with the summary), and the context shift (oldest turns dropped with a notice, before a
reply and in the middle of one, never an exit), and a reply's reasoning shown apart from its
answer. Greedy decoding on the default model.

usage: test_chat_pty.py TERRACE MODEL.gguf [commands,interrupt,shift,reasoning]
"""
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import tempfile
import time

try:
    import fcntl
    import termios
except ImportError:  # pragma: no cover
    fcntl = termios = None

FAILS = []


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what)
    if not cond:
        FAILS.append(what)


class Term:
    """terrace in a pty of 40 x 160 characters; everything it writes (stdout and stderr) is
    collected in self.out"""

    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ["TERM"] = "xterm"
            os.execv(argv[0], argv)
        if fcntl:
            fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        self.out = ""
        self.pos = 0
        self.status = None

    def _read(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the child closed the terminal
            data = b""
        if not data:
            return None
        self.out += data.decode("utf-8", "replace")
        return True

    def expect(self, pattern, timeout=60):
        """waits until `pattern` (a regex) appears after the last match; returns the match"""
        rx = re.compile(pattern)
        end = time.time() + timeout
        while True:
            m = rx.search(self.out, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = end - time.time()
            if left <= 0 or self._read(min(left, 0.5)) is None:
                m = rx.search(self.out, self.pos)
                if m:
                    self.pos = m.end()
                    return m
                return None

    def prompt(self, timeout=90):
        return self.expect(r"(?:^|\n)> ", timeout)

    def send(self, text):
        os.write(self.fd, text.encode())

    def wait(self, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.1):
                    pass
                self.status = os.waitstatus_to_exitcode(st)
                return self.status
            self._read(0.2)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None


def commands(terrace, model, tmp):
    print("commands, multi-line input, /save and /load")
    save = os.path.join(tmp, "conv.json")
    t = Term([terrace, "chat", "-m", model, "--temp", "0", "-n", "12", "-sys", "Be brief."])
    check(t.prompt() is not None, "the prompt appears")
    t.send("/help\n")
    check(t.expect(r"/save FILE") is not None and t.expect(r"/load FILE") is not None,
          "/help lists the commands")
    check(t.prompt() is not None, "back at the prompt after /help")
    t.send("/frobnicate\n")
    check(t.expect(r"unknown command '/frobnicate'") is not None, "an unknown command is named")
    t.prompt()
    t.send("Name a colour.\\\nJust one.\n")  # trailing backslash: one message of two lines
    check(t.prompt() is not None, "a two-line message is answered")
    t.send('"""\nFirst line.\nSecond line.\n"""\n')
    check(t.prompt() is not None, 'a """ block is answered')
    t.send("//slash at the start\n")
    check(t.prompt() is not None, "a // message is sent as text")
    t.send("/save " + save + "\n")
    check(t.expect(r"saved 7 messages to") is not None, "/save reports 7 messages")
    t.prompt()
    conv = json.load(open(save)) if os.path.exists(save) else []
    roles = [m.get("role") for m in conv]
    check(roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"],
          f"saved roles {roles}")
    if len(conv) == 7:
        check(conv[1]["content"] == "Name a colour.\nJust one.", "backslash continuation joined")
        check(conv[3]["content"] == "First line.\nSecond line.", '""" block joined')
        check(conv[5]["content"] == "/slash at the start", "// sent as /")
        check(all(isinstance(m["content"], str) and (m["role"] != "assistant" or m["content"])
                  for m in conv), "the replies are saved")
    t.send("/clear\n")
    check(t.expect(r"new conversation") is not None, "/clear")
    t.prompt()
    t.send("/save " + save + ".2\n")
    t.expect(r"saved 1 messages")
    t.prompt()
    check(len(json.load(open(save + ".2"))) == 1, "/clear keeps only the system message")
    with open(os.path.join(tmp, "bad.json"), "w") as f:
        f.write('[{"role": "user"}, 3]')
    t.send("/load " + os.path.join(tmp, "bad.json") + "\n")
    check(t.expect(r"message 1 has no role") is not None, "a malformed conversation is refused")
    t.prompt()
    t.send("/save " + save + ".3\n")
    t.expect(r"saved \d+ messages")
    t.prompt()
    check(json.load(open(save + ".3")) == json.load(open(save + ".2")),
          "and the conversation is left as it was")
    t.send("/load " + save + "\n")
    check(t.expect(r"loaded 7 messages from") is not None, "/load")
    t.prompt()
    t.send("And another?\n")
    check(t.prompt() is not None, "the loaded conversation goes on")
    t.send("/exit\n")
    rc = t.wait()
    check(rc == 0, f"/exit leaves with status 0 (got {rc})")
    check("terrace: generated" in t.out, "the summary is printed at the end")


def interrupt(terrace, model):
    print("Ctrl-C during a reply and at the prompt")
    t = Term([terrace, "chat", "-m", model, "--temp", "0", "-n", "3000", "--ignore-eos",
              "-c", "4096"])
    check(t.prompt() is not None, "the prompt appears")
    t.send("Write a very long story about a lighthouse.\n")
    # wait for some reply text, then interrupt it
    start = len(t.out)
    end = time.time() + 60
    while len(t.out) - start < 120 and time.time() < end:
        t._read(0.2)
    t0 = time.time()
    t.send("\x03")
    check(t.expect(r"\[interrupted\]", 20) is not None, "Ctrl-C stops the reply")
    check(t.prompt(20) is not None, f"and returns to the prompt ({time.time() - t0:.1f} s)")
    pid, _ = os.waitpid(t.pid, os.WNOHANG)
    check(pid == 0, "the process is still running")
    t.send("/save /dev/stdout\n")  # the interrupted reply is kept as the assistant's turn
    m = t.expect(r"saved 2 messages")
    check(m is not None, "the interrupted reply is part of the conversation")
    t.prompt()
    t.send("\x03")
    rc = t.wait()
    check(rc == 130, f"Ctrl-C at the prompt exits with 130 (got {rc})")
    check("terrace: generated" in t.out and "stopped by interrupted" in t.out,
          "with the summary (stopped by interrupted)")


def shift_run(terrace, model, n_predict, questions, save):
    t = Term([terrace, "chat", "-m", model, "--temp", "0", "-n", str(n_predict), "--ignore-eos",
              "-c", "256", "-sys", "You are a helpful assistant."])
    check(t.prompt() is not None, "the prompt appears")
    for q in questions:
        t.send(q + "\n")
        if t.prompt(120) is None:
            break
    t.send("/save " + save + "\n")
    t.expect(r"saved (\d+) messages")
    t.prompt()
    t.send("/exit\n")
    rc = t.wait()
    check(rc == 0, f"the chat never exits on a full context (status {rc})")
    check("error" not in t.out, "no error")
    notices = re.findall(r"context full: dropped the \d+ oldest messages|"
                         r"context: dropped the \d+ oldest messages", t.out)
    print("  notices: " + "; ".join(notices))
    conv = json.load(open(save)) if os.path.exists(save) else []
    users = [m["content"] for m in conv if m["role"] == "user"]
    check(conv and conv[0]["role"] == "system" and users and users[0] != questions[0]
          and users[-1] == questions[-1],
          f"the oldest turns are gone, the system prompt and the last turn stay ({len(conv)} "
          f"messages, users {users})")
    return notices


def context_shift(terrace, model, tmp):
    qs = ["Tell me about the sea.", "Tell me about mountains.", "Tell me about rivers."]
    print("context shift in the middle of a reply: -c 256, replies of 120 tokens")
    notices = shift_run(terrace, model, 120, qs, os.path.join(tmp, "shift1.json"))
    check(any(n.startswith("context full") for n in notices),
          "a reply that fills the context drops the oldest turn and goes on")
    print("context shift before a reply: -c 256, replies of 200 tokens")
    notices = shift_run(terrace, model, 200, qs, os.path.join(tmp, "shift2.json"))
    check(any(n.startswith("context:") for n in notices),
          "a prompt that would not leave room for the reply drops the oldest turn first")


def reasoning(terrace, model, tmp):
    """a DeepSeek-R1-style template, whose prompt ends inside <think>: the reply is reasoning
    until </think>, shown on stderr between markers (not a terminal here); stdout carries only
    the answer; --reasoning-format none shows the reply as it is"""
    import subprocess
    print("reasoning shown apart from the answer (a template that opens <think>)")
    tpl = os.path.join(tmp, "think.jinja")
    with open(tpl, "w") as f:
        f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
                "{% endif %}")
    args = [terrace, "chat", "-m", model, "--temp", "0", "-n", "24", "--chat-template", tpl,
            "-p", "Is water wet?"]
    r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    m = re.search(r"\[reasoning\]\n(.*?)(\n\[/reasoning\]|$)", r.stderr, re.S)
    check(r.returncode == 0 and m is not None and len(m.group(1).strip()) > 0,
          f"the reasoning is on stderr between markers ({m.group(1)[:60]!r})" if m else
          f"the reasoning is on stderr between markers (stderr: {r.stderr[-300:]!r})")
    n = subprocess.run(args + ["--reasoning-format", "none"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    check(n.returncode == 0 and "[reasoning]" not in n.stderr and m is not None
          and n.stdout.strip().startswith(m.group(1).strip()[:20]),
          "--reasoning-format none: the same reply, all on stdout")
    if m:
        rest = r.stdout.strip()
        check(not rest or m.group(1).strip()[:20] not in rest,
              f"stdout holds only the answer ({rest[:60]!r})")


def main():
    terrace, model = sys.argv[1], sys.argv[2]
    parts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["commands", "interrupt", "shift",
                                                               "reasoning"]
    with tempfile.TemporaryDirectory() as tmp:
        if "commands" in parts:
            commands(terrace, model, tmp)
        if "interrupt" in parts:
            interrupt(terrace, model)
        if "shift" in parts:
            context_shift(terrace, model, tmp)
        if "reasoning" in parts:
            reasoning(terrace, model, tmp)
    if FAILS:
        print(f"test_chat_pty: {len(FAILS)} check(s) FAILED")
        return 1
    print("test_chat_pty: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
