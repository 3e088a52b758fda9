#!/usr/bin/env python3
"""terrace serve renders chat requests through the model's own chat template and returns the
reasoning apart, on the synthetic chat models of tests/py/synth.py --chat (gpt-oss, qwen3moe, a
qwen2 DeepSeek-R1 distill, phimoe: each with its family's real template and weights that make
greedy decoding write a fixed reply in the family's format). For each model:
- /v1/chat/completions: `content` is the answer, `reasoning_content` the reasoning (harmony's
  analysis channel, Qwen3's <think>, R1's <think> opened by its template), finish_reason stop;
- the stream's reasoning_content and content pieces reassemble to the same two texts;
- Ollama's /api/chat gives the answer in content and the reasoning in `thinking`;
- the prompt is the template's rendering as jinja2 (HF's environment) writes it: the same
  number of tokens as that text sent to /v1/completions (less the BOS the tokenizer adds when the
  template already wrote one), and the completion is the model's raw reply;
then a two-turn gpt-oss conversation whose history carries the previous reasoning
(reasoning_content), --reasoning-format none (the reply as written, in content), and a model
without a template (400 naming --chat-template; --chat-template chatml serves it).

usage: test_serve_templates.py TERRACE TEMPLATES_DIR
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
import serve_util as su  # noqa: E402
import synth  # noqa: E402
from serve_util import check  # noqa: E402
from test_chat_templates import EXPECT, bytes_text  # noqa: E402

TERRACE, TDIR = sys.argv[1], sys.argv[2]
HI = [{"role": "user", "content": "Hi"}]


def chat(srv, messages, **kw):
    body = {"messages": messages, "temperature": 0, "max_tokens": 64}
    body.update(kw)
    return srv.request("POST", "/v1/chat/completions", body)


def chat_stream(srv, messages):
    c = srv.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": messages, "temperature": 0, "max_tokens": 64, "stream": True}),
        headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    reasoning, content, finish, done = [], [], None, False
    for ev in su.sse_events(resp):
        if ev == "[DONE]":
            done = True
            continue
        ch = json.loads(ev)
        for choice in ch.get("choices", []):
            d = choice.get("delta", {})
            reasoning.append(d.get("reasoning_content") or "")
            content.append(d.get("content") or "")
            finish = choice.get("finish_reason") or finish
    c.close()
    return "".join(reasoning), "".join(content), finish, done


with tempfile.TemporaryDirectory() as tmp:
    for arch, (family, reasoning, answer) in EXPECT.items():
        spec = synth.CHAT_SPECS[arch]
        model = os.path.join(tmp, f"chat-{arch}.gguf")
        p = subprocess.run([sys.executable, os.path.join(HERE, "synth.py"), arch, "F32", model,
                            "--chat", TDIR], capture_output=True, text=True)
        if not check(p.returncode == 0, f"{arch}: synth.py --chat: {p.stderr}"):
            continue
        raw = bytes_text(t for t in spec["reply"][:-1])
        srv = su.Server(TERRACE, model, "-np", "2", "-c", "1024")
        try:
            check(f"chat template {family} (the model's Jinja template)" in srv.output(),
                  f"{arch}: the server names the model's own template: {srv.output()[-400:]}")
            st, _, r = chat(srv, HI)
            ok = check(st == 200, f"{arch}: chat {st} {r}")
            m = r["choices"][0]["message"] if ok else {}
            check(m.get("content") == answer, f"{arch}: content {m.get('content')!r}, want {answer!r}")
            got_r = m.get("reasoning_content")
            if reasoning:
                check(got_r is not None and got_r.strip() == reasoning,
                      f"{arch}: reasoning_content {got_r!r}, want {reasoning!r}")
            else:
                check(got_r is None, f"{arch}: a reply without reasoning has reasoning_content {got_r!r}")
            check(ok and r["choices"][0]["finish_reason"] == "stop", f"{arch}: finish {r}")

            s_r, s_c, s_fin, s_done = chat_stream(srv, HI)
            check(s_c == m.get("content") and s_r == (got_r or "") and s_fin == "stop" and s_done,
                  f"{arch}: the stream reassembles to ({s_r!r}, {s_c!r}, {s_fin}, {s_done}), "
                  f"non-streamed ({got_r!r}, {m.get('content')!r})")

            st, _, o = srv.request("POST", "/api/chat", {"messages": HI, "stream": False,
                                                         "options": {"temperature": 0, "num_predict": 64}})
            check(st == 200 and o["message"]["content"] == answer and
                  (o["message"].get("thinking") or "").strip() == (reasoning or ""),
                  f"{arch}: /api/chat {o}")

            # the server's prompt is jinja2's rendering of the model's template
            src = open(os.path.join(TDIR, spec["template"]), encoding="utf-8").read()
            want = jinja_ref.render(src, HI, True, spec["bos"], spec["eos"], None, datetime.now())
            if check(want[0] == "ok", f"{arch}: jinja2 renders the template: {want}"):
                st, _, c = srv.request("POST", "/v1/completions", {"prompt": want[1], "temperature": 0,
                                                                   "max_tokens": 64})
                second_bos = spec["add_bos"] and want[1].startswith(spec["bos"])
                n_chat = r["usage"]["prompt_tokens"] if ok else -1
                check(st == 200 and c["usage"]["prompt_tokens"] - second_bos == n_chat,
                      f"{arch}: chat prompt {n_chat} tokens, the jinja2 rendering {c.get('usage')} "
                      f"(a second BOS: {second_bos})")
                check(st == 200 and c["choices"][0]["text"] == raw,
                      f"{arch}: the rendering as a completion prompt writes {c} , want {raw!r}")
            if arch == "gpt-oss":
                # the history's reasoning goes back through the template (which drops it for a
                # finished turn) and the answer stays the same
                st, _, r2 = chat(srv, HI + [{"role": "assistant", "content": answer,
                                             "reasoning_content": reasoning},
                                            {"role": "user", "content": "Hi again"}])
                check(st == 200 and r2["choices"][0]["message"]["content"] == answer and
                      r2["choices"][0]["message"].get("reasoning_content", "").strip() == reasoning,
                      f"gpt-oss: a second turn {st} {r2}")
                # the template's own error (a raise_exception) is a 400 with its message
                st, _, r3 = chat(srv, HI + [{"role": "assistant",
                                             "content": "<|channel|>final<|message|>Hello!"},
                                            {"role": "user", "content": "Hi again"}])
                check(st == 400 and "chat template" in r3["error"]["message"],
                      f"gpt-oss: a conversation the template refuses: {st} {r3}")
        finally:
            check(srv.stop() == 0, f"{arch}: the server exit status")

        if arch == "qwen3moe":
            srv = su.Server(TERRACE, model, "-np", "1", "-c", "256", "--reasoning-format", "none")
            try:
                st, _, r = chat(srv, HI)
                check(st == 200 and r["choices"][0]["message"]["content"] == raw and
                      "reasoning_content" not in r["choices"][0]["message"],
                      f"--reasoning-format none: {r}")
            finally:
                check(srv.stop() == 0, "--reasoning-format none: exit status")

    plain = os.path.join(tmp, "plain.gguf")
    subprocess.run([sys.executable, os.path.join(HERE, "synth.py"), "phimoe", "F32", plain], check=True)
    srv = su.Server(TERRACE, plain, "-np", "1", "-c", "256")
    try:
        check("chat requests will be refused" in srv.output(), f"no template: {srv.output()[-300:]}")
        st, _, r = chat(srv, HI)
        check(st == 400 and "--chat-template" in r["error"]["message"], f"no template: {st} {r}")
    finally:
        check(srv.stop() == 0, "no template: exit status")
    srv = su.Server(TERRACE, plain, "-np", "1", "-c", "256", "--chat-template", "chatml")
    try:
        st, _, r = chat(srv, HI, max_tokens=4)
        check(st == 200 and "chat template chatml" in srv.output(), f"--chat-template chatml: {st} {r}")
    finally:
        check(srv.stop() == 0, "--chat-template chatml: exit status")
su.done("test_serve_templates")
