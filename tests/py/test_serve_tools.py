#!/usr/bin/env python3
"""Tool calling through terrace serve, on the synthetic Qwen3 chat model of tests/py/synth.py
(qwen3moe-tools: Qwen3's real template, weights that make greedy decoding answer with
`<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>`):

- through the official `openai` package: the request's tools reach the template (the prompt is
  jinja2's rendering with them), the reply's call comes back as message.tool_calls with its
  arguments as a JSON string, content null, finish_reason tool_calls; streamed, the deltas
  reassemble to the same call and no call text leaks into the content;
- the next turn, with the assistant's tool_calls (arguments as a string, content null) and the
  tool's result, renders as jinja2 renders it with the arguments as an object (Hugging Face's
  convention);
- without tools, the same reply is plain content (nothing is parsed); tool_choice "none" sends no
  tools; Ollama's /api/chat returns the call with its arguments as an object;
- a bad tools field, tool_choice "required" or naming a function, tools on /v1/completions: 400.

usage: test_serve_tools.py TERRACE TEMPLATES_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

import openai

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import jinja_ref  # noqa: E402
import serve_util as su  # noqa: E402
import synth  # noqa: E402
from serve_util import check  # noqa: E402

TERRACE, TDIR = sys.argv[1], sys.argv[2]
SPEC = synth.CHAT_SPECS["qwen3moe-tools"]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RAW = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def jinja_tokens(srv, messages, tools):
    """prompt tokens of jinja2's rendering of the template (through /v1/completions)"""
    src = open(os.path.join(TDIR, SPEC["template"]), encoding="utf-8").read()
    want = jinja_ref.render(src, messages, True, SPEC["bos"], SPEC["eos"], {"tools": tools},
                            datetime.now())
    if not check(want[0] == "ok", f"jinja2 renders the template: {want}"):
        return -1
    st, _, c = srv.request("POST", "/v1/completions", {"prompt": want[1], "max_tokens": 1})
    return c["usage"]["prompt_tokens"] if st == 200 else -1


with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, "chat-qwen3-tools.gguf")
    p = subprocess.run([sys.executable, os.path.join(HERE, "synth.py"), "qwen3moe-tools", "F32",
                        model, "--chat", TDIR], capture_output=True, text=True)
    if not check(p.returncode == 0, f"synth.py --chat: {p.stderr}"):
        su.done("test_serve_tools")
    srv = su.Server(TERRACE, model, "-np", "2", "-c", "1024")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused",
                               max_retries=0, timeout=120)
        MID = client.models.list().data[0].id
        r = client.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, temperature=0,
                                           max_tokens=64)
        c = r.choices[0]
        calls = c.message.tool_calls or []
        ok = check(len(calls) == 1 and calls[0].type == "function" and
                   calls[0].function.name == "get_weather" and calls[0].id.startswith("call_"),
                   f"tool_calls: {c}")
        check(ok and json.loads(calls[0].function.arguments) == {"city": "Paris"},
              f"arguments: {c}")
        check(c.message.content is None and c.finish_reason == "tool_calls",
              f"content {c.message.content!r}, finish {c.finish_reason}")
        check(r.usage.prompt_tokens == jinja_tokens(srv, ASK, TOOLS),
              f"the prompt with tools is not jinja2's rendering ({r.usage.prompt_tokens} tokens)")
        print(f"  tool call: {calls[0].function.name}({calls[0].function.arguments}), "
              f"{r.usage.prompt_tokens} prompt tokens as jinja2 renders them with the tools")

        # streamed: the call in a delta, no call text in the content
        parts, scalls, finish = [], {}, None
        for ch in client.chat.completions.create(model=MID, messages=ASK, tools=TOOLS,
                                                 temperature=0, max_tokens=64, stream=True):
            for cc in ch.choices:
                parts.append(cc.delta.content or "")
                for tc in cc.delta.tool_calls or []:
                    d = scalls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
                    d["id"] = tc.id or d["id"]
                    d["name"] += tc.function.name or ""
                    d["arguments"] += tc.function.arguments or ""
                finish = cc.finish_reason or finish
        check("".join(parts) == "" and finish == "tool_calls" and list(scalls) == [0] and
              scalls[0]["name"] == "get_weather" and ok and
              scalls[0]["arguments"] == calls[0].function.arguments,
              f"stream: content {''.join(parts)!r}, calls {scalls}, finish {finish}")

        # the next turn: the call and its result go back through the template
        turn2 = ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0].id if ok else "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": calls[0].id if ok else "call_0",
             "content": "22 C, sunny"}]
        st, _, r2 = srv.request("POST", "/v1/chat/completions",
                                {"messages": turn2, "tools": TOOLS, "temperature": 0,
                                 "max_tokens": 8})
        hf = json.loads(json.dumps(turn2))
        hf[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
        hf[1]["content"] = ""
        check(st == 200 and r2["usage"]["prompt_tokens"] == jinja_tokens(srv, hf, TOOLS),
              f"second turn: {st} {r2}")
        print(f"  the call and its result in the next turn: {r2['usage']['prompt_tokens']} prompt "
              f"tokens, as jinja2 renders them")

        # without tools nothing is parsed; tool_choice none sends none
        st, _, r3 = srv.request("POST", "/v1/chat/completions",
                                {"messages": ASK, "temperature": 0, "max_tokens": 64})
        check(st == 200 and r3["choices"][0]["message"]["content"] == RAW and
              "tool_calls" not in r3["choices"][0]["message"] and
              r3["choices"][0]["finish_reason"] == "stop", f"no tools: {r3}")
        st, _, r4 = srv.request("POST", "/v1/chat/completions",
                                {"messages": ASK, "tools": TOOLS, "tool_choice": "none",
                                 "temperature": 0, "max_tokens": 64})
        check(st == 200 and r4["usage"]["prompt_tokens"] == r3["usage"]["prompt_tokens"] and
              "tool_calls" not in r4["choices"][0]["message"], f"tool_choice none: {r4}")

        # Ollama: the arguments as an object, streamed or not
        for stream in (False, True):
            c2 = srv.conn()
            c2.request("POST", "/api/chat", body=json.dumps(
                {"messages": ASK, "tools": TOOLS, "stream": stream,
                 "options": {"temperature": 0, "num_predict": 64}}),
                headers={"Content-Type": "application/json"})
            lines = [json.loads(x) for x in c2.getresponse().read().decode().splitlines() if x]
            c2.close()
            got = [tc for o in lines for tc in o.get("message", {}).get("tool_calls", [])]
            text = "".join(o.get("message", {}).get("content", "") for o in lines)
            check(len(got) == 1 and got[0]["function"] == {"name": "get_weather",
                                                           "arguments": {"city": "Paris"}} and
                  text == "" and lines[-1].get("done"), f"/api/chat stream={stream}: {lines}")

        # refusals
        bad = [({"messages": ASK, "tools": {"a": 1}}, "tools"),
               ({"messages": ASK, "tools": [{"type": "function"}]}, "tools"),
               ({"messages": ASK, "tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
               ({"messages": ASK, "tools": TOOLS,
                 "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                "tool_choice")]
        for body, param in bad:
            st, _, e = srv.request("POST", "/v1/chat/completions", body)
            check(st == 400 and e["error"]["param"] == param, f"{body}: {st} {e}")
        st, _, e = srv.request("POST", "/v1/completions", {"prompt": "x", "tools": TOOLS})
        check(st == 400 and e["error"]["param"] == "tools", f"completions with tools: {st} {e}")
        print("  no tools: the reply as content; tool_choice none; Ollama's shape; refusals")
    finally:
        check(srv.stop() == 0, "the server's exit status")
su.done("test_serve_tools")
