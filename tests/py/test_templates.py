#!/usr/bin/env python3
"""Every chat template in the shared test data, rendered by `terrace template` for a set of
conversations, compared byte for byte with Python's jinja2 in Hugging Face's environment
(tests/py/jinja_ref.py), rendered here at test time. Where jinja2 raises (raise_exception in
the template, a value the template cannot use), terrace must fail with the same message and
exception class.

Conversations: one user turn; system + user; multi-turn; a conversation ending with the
assistant; unicode and whitespace at the edges; tool definitions with tool calls (arguments as
an object and as a JSON string, content null and text) and tool results; reasoning (inline
<think>, reasoning_content, thinking); enable_thinking false; gpt-oss's options; empty content;
roles that do not alternate; a lone system message; a long conversation. Each with
add_generation_prompt on and off.

usage: test_templates.py TERRACE TEMPLATES_DIR [--list]
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_ref  # noqa: E402

NOW = "2025-01-15T12:00:00"
BOS, EOS = "<s>", "</s>"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Forecast days", "default": 1},
                "hourly": {"type": "boolean"},
                "sources": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
                       "required": ["query"]},
    },
}
TOOLS = {"tools": [WEATHER, SEARCH]}

SYS = {"role": "system", "content": "You are a helpful assistant."}


def u(text):
    return {"role": "user", "content": text}


def a(text, **extra):
    m = {"role": "assistant", "content": text}
    m.update(extra)
    return m


CALL_OBJ = {"id": "call12345", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL_STR = {"id": "call67890", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}

CONVERSATIONS = [
    ("user", [u("Hello!")], None),
    ("system+user", [SYS, u("What is 2+2?")], None),
    ("multi-turn", [SYS, u("What is 2+2?"), a("2+2 is 4."), u("And 3+3?")], None),
    ("ends-with-assistant", [u("Hi"), a("Hello! How can I help?"), u("Tell me a joke."),
                             a("Why did the chicken cross the road?")], None),
    ("unicode", [{"role": "system", "content": "  Réponds en français.\n"},
                 u("Ünïcödé 😀 — 中文 \"quotes\" 'apos' \\back\\slash <b>&amp;</b>\ttab\r\nnext"),
                 a("  Voilà :\n- un\n- deux  \n"), u("Merci ✓ ΣΑΣ")], None),
    ("tools-call-object", [SYS, u("What's the weather in Paris?"),
                           a(None, tool_calls=[CALL_OBJ]),
                           {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                            "content": "{\"temperature\": 18}"},
                           a("It is 18 °C in Paris.")], TOOLS),
    ("tools-call-string", [u("Weather in Lyon?"), a("Let me check.", tool_calls=[CALL_STR]),
                           {"role": "tool", "tool_call_id": "call67890", "content": "sunny"}], TOOLS),
    ("tools-defined-only", [u("Search for cats.")], TOOLS),
    ("reasoning-inline", [u("What is 17*23?"), a("<think>\n17*23 = 391\n</think>\n\n391"), u("And 17*24?")], None),
    ("reasoning-fields", [u("What is 17*23?"),
                          a("391", reasoning_content="17*23 = 391", thinking="17*23 = 391")], None),
    ("no-thinking", [u("Hi")], {"enable_thinking": False}),
    ("harmony-options", [{"role": "system", "content": "Be brief."}, u("Hi")],
     {"reasoning_effort": "high", "model_identity": "You are a test model.", "builtin_tools": ["browser", "python"]}),
    ("empty-content", [u("")], None),
    ("not-alternating", [u("a"), u("b")], None),
    ("system-only", [SYS], None),
    ("long", [SYS] + [m for i in range(5) for m in (u(f"Question {i}?"), a(f"Answer {i}."))] + [u("Last?")], None),
]


def run_case(terrace, tmpl, msgs_path, ctx_path, gen):
    cmd = [terrace, "template", tmpl, "--messages", msgs_path, "--bos-token", BOS, "--eos-token", EOS,
           "--now", NOW]
    if ctx_path:
        cmd += ["--context", ctx_path]
    if not gen:
        cmd.append("--no-generation-prompt")
    p = subprocess.run(cmd, capture_output=True)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    terrace, tdir = argv[1], argv[2]
    templates = sorted(f for f in os.listdir(tdir) if f.endswith(".jinja"))
    if not templates:
        print(f"no .jinja files in {tdir}")
        return 1
    now = datetime.fromisoformat(NOW)
    t0 = time.time()
    bad = cases = errors_matched = 0
    per_template = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, msgs, ctx in CONVERSATIONS:
            with open(os.path.join(tmp, name + ".msgs.json"), "w", encoding="utf-8") as f:
                json.dump(msgs, f, ensure_ascii=False)
            if ctx:
                with open(os.path.join(tmp, name + ".ctx.json"), "w", encoding="utf-8") as f:
                    json.dump(ctx, f, ensure_ascii=False)
        for tname in templates:
            path = os.path.join(tdir, tname)
            source = open(path, encoding="utf-8").read()
            ok_t = 0
            for name, msgs, ctx in CONVERSATIONS:
                mp = os.path.join(tmp, name + ".msgs.json")
                cp = os.path.join(tmp, name + ".ctx.json") if ctx else None
                for gen in (True, False):
                    cases += 1
                    want = jinja_ref.render(source, msgs, gen, BOS, EOS, ctx, now)
                    rc, out, err = run_case(terrace, path, mp, cp, gen)
                    if want[0] == "ok":
                        good = rc == 0 and out == want[1]
                    else:
                        # terrace: error: FILE: MESSAGE (Kind, template line N)
                        good = rc != 0 and f": {want[2]} ({want[1]}" in err
                        errors_matched += good
                    if good:
                        ok_t += 1
                        continue
                    bad += 1
                    print(f"MISMATCH {tname} / {name} / add_generation_prompt={gen}")
                    print(f"  jinja2:  {want!r}"[:2000])
                    print(f"  terrace: rc={rc} out={out!r} err={err.strip()!r}"[:2000])
            per_template[tname] = ok_t
    n_conv = 2 * len(CONVERSATIONS)
    identical = sum(1 for v in per_template.values() if v == n_conv)
    for tname in templates:
        print(f"  {per_template[tname]:3d}/{n_conv} {tname}")
    print(f"{identical}/{len(templates)} templates identical to jinja2 for all {n_conv} conversations; "
          f"{cases - bad}/{cases} renders identical ({errors_matched} of them jinja2's errors, "
          f"matched); {time.time() - t0:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
