#!/usr/bin/env python3
"""The reference renderer for chat templates: Python's jinja2 in the environment Hugging Face's
transformers builds for apply_chat_template (render_jinja_template / _compile_jinja_template):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)
    globals["raise_exception"] raises TemplateError(message)
    globals["strftime_now"] = datetime.now().strftime(format)

and the variables apply_chat_template passes: messages, tools (None unless given), documents
(None), add_generation_prompt, the special tokens (bos_token, eos_token), then the caller's
extra variables. AssistantTracker is HF's {% generation %} tag: a call block whose caller renders
the body (HF tracks the assistant's spans with it; the text is unchanged).

As a module: render(source, messages, add_generation_prompt, bos, eos, context, now) returns
("ok", text) or ("error", exception class name, message).
As a script: jinja_ref.py TEMPLATE MESSAGES.json [--context CTX.json] [--no-generation-prompt]
    [--bos-token S] [--eos-token S] [--now 2025-01-15T12:00:00] prints the text (or the error
    on stderr, exit 1), like `terrace template`.
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return (now or datetime.now()).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(source, messages, add_generation_prompt=True, bos=None, eos=None, context=None, now=None):
    env = make_env(now)
    variables = {"messages": messages, "tools": None, "documents": None,
                 "add_generation_prompt": add_generation_prompt}
    if bos is not None:
        variables["bos_token"] = bos
    if eos is not None:
        variables["eos_token"] = eos
    variables.update(context or {})
    try:
        return ("ok", env.from_string(source).render(**variables))
    except jinja2.TemplateSyntaxError as e:
        return ("error", type(e).__name__, e.message)
    except Exception as e:  # jinja2's and Python's runtime errors
        return ("error", type(e).__name__, str(e))


def main(argv):
    args = argv[1:]
    opts = {"gen": True, "bos": None, "eos": None, "context": None, "now": None}
    pos = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--no-generation-prompt":
            opts["gen"] = False
        elif a in ("--context", "--bos-token", "--eos-token", "--now"):
            i += 1
            opts[a[2:].split("-")[0]] = args[i]
        else:
            pos.append(a)
        i += 1
    source = open(pos[0], encoding="utf-8").read()
    messages = json.load(open(pos[1], encoding="utf-8"))
    context = json.load(open(opts["context"], encoding="utf-8")) if opts["context"] else None
    now = datetime.fromisoformat(opts["now"]) if opts["now"] else None
    r = render(source, messages, opts["gen"], opts["bos"], opts["eos"], context, now)
    if r[0] == "ok":
        sys.stdout.write(r[1])
        return 0
    sys.stderr.write(f"{r[1]}: {r[2]}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
