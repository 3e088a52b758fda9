#!/usr/bin/env python3
"""Differential test of the template engine against jinja2: random templates (statements,
whitespace control, expressions, filters, tests, methods, macros, loops, namespaces) over random
data, rendered by jinja2 in HF's environment (jinja_ref.py) and by the engine
(`test_jinja --batch`), then compared: the same text, or the same error message and class.
The engine may instead answer "unsupported" (it names the construct); those are counted, not
failed.

usage: jinja_diff.py TEST_JINJA N [SEED] [--show K]
exit status 1 if any case differs.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_ref  # noqa: E402

STRINGS = ["", " ", "a", "Hello", "  padded  ", "line1\nline2", "tab\there", "é", "ΣΑΣ", "ǆ", "😀",
           "it's", 'say "hi"', "back\\slash", "<think>x</think>y", "a,b,,c", "user", "assistant",
           "system", "tool", "ß", "İ", "\u3000wide\u00a0", "x" * 30, "UPPER lower", "123", "4.5", "0x1f"]
KEYS = ["role", "content", "name", "a", "b", "items", "keys", "tool_calls", "0", "type"]
FILTERS = [
    ("trim", []), ("trim", ["'ax'"]), ("upper", []), ("lower", []), ("capitalize", []), ("title", []),
    ("length", []), ("count", []), ("list", []), ("first", []), ("last", []), ("string", []),
    ("tojson", []), ("tojson(indent=2)", None), ("tojson(sort_keys=true)", None), ("join", ["', '"]), ("join", []),
    ("default", ["'d'"]), ("default", ["'d'", "true"]), ("d", ["1"]), ("reverse", []), ("sort", []),
    ("sort", ["reverse=true"]), ("unique", []), ("items", []), ("dictsort", []), ("int", []), ("float", []),
    ("abs", []), ("round", []), ("round", ["1"]), ("replace", ["'a'", "'b'"]), ("select", []),
    ("reject", []), ("select", ["'odd'"]), ("reject", ["'none'"]), ("selectattr", ["'role'"]),
    ("selectattr", ["'role'", "'equalto'", "'user'"]), ("rejectattr", ["'content'"]),
    ("map", ["'upper'"]), ("map", ["attribute='role'"]), ("map", ["attribute='a'", "default=0"]),
    ("max", []), ("min", []), ("sum", []), ("indent", ["2"]), ("center", ["9"]), ("wordcount", []),
    ("batch", ["2"]), ("slice", ["2"]), ("truncate", ["10"]), ("format", ["1"]), ("attr", ["'role'"]),
    ("nosuchfilter", []),
]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "sequence",
         "iterable", "callable", "odd", "even", "true", "false", "boolean", "lower", "upper",
         "divisibleby 2", "equalto 'user'", "sameas none", "in ['a', 'user']", "eq 1", "gt 0", "lessthan 3",
         "filter", "test", "nosuchtest"]
STR_METHODS = ["strip()", "strip('a')", "lstrip()", "rstrip('\\n')", "split()", "split(',')", "split(',', 1)",
               "rsplit(' ', 1)", "startswith('a')", "endswith(('o', 'x'))", "upper()", "lower()", "title()",
               "capitalize()", "replace('a', 'A')", "find('l')", "count('l')", "splitlines()", "isdigit()",
               "isspace()", "join(['x', 'y'])", "center(7, '*')", "zfill(5)", "partition(' ')", "format(1)",
               "swapcase()", "removeprefix('He')", "islower()", "index('z')"]
DICT_METHODS = ["get('role')", "get('zz', 'dflt')", "items()", "keys()", "values()", "copy()", "update({})"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or", "**"]


class Gen:
    def __init__(self, rng):
        self.r = rng
        self.names = ["messages", "x", "s", "n", "d", "l", "f", "missing"]
        self.loop_depth = 0
        self.macros = []

    def value(self, depth=0):
        r = self.r
        k = r.randrange(10 if depth < 2 else 6)
        if k == 0: return r.choice([0, 1, 2, -3, 7, 42, 1000000])
        if k == 1: return r.choice([0.5, -0.0, 1e20, 1 / 3, 2.0, 1.5e-7])
        if k in (2, 3): return r.choice(STRINGS)
        if k == 4: return r.choice([True, False])
        if k == 5: return None
        if k in (6, 7): return [self.value(depth + 1) for _ in range(r.randrange(4))]
        return {r.choice(KEYS): self.value(depth + 1) for _ in range(r.randrange(4))}

    def data(self):
        r = self.r
        msgs = []
        for _ in range(r.randrange(5)):
            m = {"role": r.choice(["system", "user", "assistant", "tool"]), "content": r.choice(STRINGS + [None])}
            if r.random() < 0.2:
                m["tool_calls"] = [{"function": {"name": "f", "arguments": {"a": 1}}}]
            msgs.append(m)
        return {"messages": msgs, "x": self.value(), "s": r.choice(STRINGS), "n": r.choice([0, 1, 3, -2]),
                "d": {k: self.value(1) for k in r.sample(KEYS, 3)}, "l": [self.value(1) for _ in range(3)],
                "f": r.choice([0.5, 2.0, -1.25])}

    def lit(self):
        r = self.r
        k = r.randrange(9)
        if k == 0: return str(r.choice([0, 1, 2, 3, -1, 10]))
        if k == 1: return r.choice(["0.5", "1.0", "2.5e3", "1_000"])
        if k == 2: return repr(r.choice(STRINGS)).replace("\\\\", "\\\\")
        if k == 3: return r.choice(["true", "false", "none", "True", "None"])
        if k == 4: return "[" + ", ".join(self.expr(2) for _ in range(r.randrange(3))) + "]"
        if k == 5: return "{" + ", ".join(f"'{r.choice(KEYS)}': {self.expr(2)}" for _ in range(r.randrange(3))) + "}"
        if k == 6: return "(" + ", ".join(self.expr(2) for _ in range(r.randrange(3))) + ",)"
        if k == 7: return r.choice(["'a\\nb'", "'\\u00e9\\x41'", '"q\'s"', "'\\\\'"])
        return r.choice(["range(3)", "range(1, 4)", "namespace(a=1)", "dict(a=1, b=[2])"])

    def expr(self, depth=0):
        r = self.r
        if depth > 3:
            return r.choice([self.lit(), r.choice(self.names)])
        k = r.randrange(16)
        e = lambda: self.expr(depth + 1)  # noqa: E731
        if k == 0: return self.lit()
        if k == 1: return r.choice(self.names)
        if k == 2: return f"{e()}.{r.choice(KEYS[:8])}"
        if k == 3: return f"{e()}[{r.choice(['0', '-1', '1:', ':2', '::-1', chr(39) + 'role' + chr(39), 'n'])}]"
        if k == 4:
            name, args = r.choice(FILTERS)
            if args is None:
                return f"{e()}|{name}"
            return f"{e()}|{name}" + (f"({', '.join(args)})" if args else "")
        if k == 5: return f"{e()} is {r.choice(['', 'not '])}{r.choice(TESTS)}"
        if k in (6, 7): return f"({e()} {r.choice(OPS)} {e()})"
        if k == 8: return f"not {e()}"
        if k == 9: return f"({e()} if {e()} else {e()})" if r.random() < 0.8 else f"({e()} if {e()})"
        if k == 10: return f"{r.choice(['s', 'x', repr(r.choice(STRINGS))])}.{r.choice(STR_METHODS)}"
        if k == 11: return f"{r.choice(['d', 'x', 'messages[0]'])}.{r.choice(DICT_METHODS)}"
        if k == 12 and self.macros: return f"{r.choice(self.macros)}({e()})"
        if k == 13: return f"-{e()}"
        if k == 14: return f"({e()} ~ {e()})"
        return f"{e()}|{r.choice(['list', 'length', 'first', 'string', 'tojson'])}"

    def ws(self):
        return self.r.choice(["", "", " ", "\n", "  \n", "\n  ", " \t", "\n\n"])

    def mark(self):
        return self.r.choice(["", "", "", "-", "+"])

    def tag(self, body):
        return "{%" + self.mark() + " " + body + " " + self.mark() + "%}"

    def stmts(self, depth=0, n=None):
        r = self.r
        out = []
        for _ in range(n if n is not None else r.randrange(1, 4)):
            out.append(self.stmt(depth))
        return "".join(out)

    def stmt(self, depth):
        r = self.r
        k = r.randrange(14 if depth < 3 else 4)
        if k == 0: return self.ws() + r.choice(["text", "A B", "é", "{", "}", "%", "#"]) + self.ws()
        if k in (1, 2):
            m1, m2 = r.choice(["", "-"]), r.choice(["", "-"])
            return "{{" + m1 + " " + self.expr() + " " + m2 + "}}" + self.ws()
        if k == 3: return "{#" + self.mark() + " comment " + self.mark() + "#}" + self.ws()
        if k == 4:
            s = self.tag(f"if {self.expr()}") + self.ws() + self.stmts(depth + 1)
            if r.random() < 0.3: s += self.tag(f"elif {self.expr()}") + self.stmts(depth + 1)
            if r.random() < 0.4: s += self.tag("else") + self.stmts(depth + 1)
            return s + self.tag("endif") + self.ws()
        if k == 5:
            v = r.choice(["it", "m", "k, v"])
            it = r.choice(["messages", "l", "d", "s", "range(3)", "x", "d.items()", "messages|selectattr('role')"])
            cond = f" if {self.expr(2)}" if r.random() < 0.2 else ""
            self.names.append(v.split(",")[0])
            self.loop_depth += 1
            body = self.stmts(depth + 1)
            if r.random() < 0.5:
                body += "{{ loop." + r.choice(["index", "index0", "first", "last", "length", "revindex",
                                               "previtem", "nextitem", "cycle('a', 'b')"]) + " }}"
            if r.random() < 0.15:
                body += self.tag(f"if {self.expr(2)}") + self.tag(r.choice(["break", "continue"])) + self.tag("endif")
            self.loop_depth -= 1
            self.names.pop()
            s = self.tag(f"for {v} in {it}{cond}") + body
            if r.random() < 0.2: s += self.tag("else") + self.stmts(depth + 1)
            return s + self.tag("endfor") + self.ws()
        if k == 6:
            v = r.choice(["a", "b", "x", "s"])
            if v not in self.names: self.names.append(v)
            return self.tag(f"set {v} = {self.expr()}") + self.ws()
        if k == 7: return self.tag("set ns = namespace(c=0, t='')") + self.ws()
        if k == 8: return "{% if ns is defined %}" + self.tag(f"set ns.c = ns.c + 1") + "{% endif %}" + self.ws()
        if k == 9:
            name = r.choice(["m1", "m2"])
            body = self.stmts(depth + 1)
            s = self.tag(f"macro {name}(p, q={self.lit()})") + "{{ p }}" + body + self.tag("endmacro")
            if name not in self.macros: self.macros.append(name)
            if name not in self.names: self.names.append(name)
            return s
        if k == 10: return self.tag("set blk") + self.stmts(depth + 1) + self.tag("endset") + "{{ blk }}"
        if k == 11: return self.tag(f"filter {r.choice(['upper', 'trim', 'lower'])}") + self.stmts(depth + 1) + self.tag("endfilter")
        if k == 12: return self.tag(f"with w = {self.expr()}") + "{{ w }}" + self.stmts(depth + 1) + self.tag("endwith")
        return "{% raw %}{{ raw }}{% endraw %}" + self.ws()


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    bin_path, n = argv[1], int(argv[2])
    seed = int(argv[3]) if len(argv) > 3 and not argv[3].startswith("--") else 1
    show = int(argv[argv.index("--show") + 1]) if "--show" in argv else 10
    rng = random.Random(seed)
    now = datetime(2025, 1, 15, 12, 0, 0)
    cases = []
    for _ in range(n):
        g = Gen(rng)
        data = g.data()
        src = g.stmts(0, rng.randrange(1, 6))
        cases.append((src, data))
    with tempfile.TemporaryDirectory() as tmp:
        inp, outp = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        with open(inp, "w", encoding="utf-8") as f:
            for src, data in cases:
                f.write(json.dumps({"t": src}, ensure_ascii=False) + "\n")
                f.write(json.dumps(data, ensure_ascii=False) + "\n")
        subprocess.run([bin_path, "--batch", inp, outp], check=True)
        got = [json.loads(line) for line in open(outp, encoding="utf-8")]
    stats = Counter()
    unsupported = Counter()
    shown = 0
    for (src, data), g in zip(cases, got):
        env = jinja_ref.make_env(now)
        try:
            want = ("ok", env.from_string(src).render(**data))
        except RecursionError:
            stats["skipped (python recursion)"] += 1
            continue
        except Exception as e:
            import jinja2
            msg = e.message if isinstance(e, jinja2.TemplateSyntaxError) else str(e)
            want = ("error", type(e).__name__, msg)
        if "err" in g and "(unsupported" in g["err"]:
            stats["unsupported"] += 1
            unsupported[g["err"].split(" (unsupported")[0][:70]] += 1
            continue
        if want[0] == "ok":
            ok = g.get("ok") == want[1]
        else:
            ok = "err" in g and g["err"].startswith(f"{want[2]} ({want[1]}")
        stats["same" if ok else "DIFFERENT"] += 1
        if not ok and shown < show:
            shown += 1
            print("DIFFERENT:", json.dumps(src, ensure_ascii=False))
            print("  data:   ", json.dumps(data, ensure_ascii=False)[:300])
            print("  jinja2: ", repr(want)[:400])
            print("  engine: ", repr(g)[:400])
    print(f"jinja_diff: {n} random templates (seed {seed}): " + ", ".join(f"{k} {v}" for k, v in stats.most_common()))
    for k, v in unsupported.most_common(8):
        print(f"  unsupported x{v}: {k}")
    return 1 if stats["DIFFERENT"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
