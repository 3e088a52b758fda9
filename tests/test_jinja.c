/*
 * The template engine's pieces, white-box: values (float repr, str/repr quoting, JSON in and out,
 * Python equality and order), the lexer's whitespace rules, scoping, errors and their messages,
 * the resource limits, the chat-template API (built-ins, files, messages_json, named templates,
 * now) and the reasoning splitter fed one byte at a time.
 *
 * usage: test_jinja                       the unit tests
 *        test_jinja --batch IN OUT         render each case of IN (a line {"t": template}, then a line
 *                                          with the variables as one JSON object)
 *                                          and write {"ok": text} or {"err": message} lines to OUT
 *                                          (tests/py/jinja_diff.py compares them with jinja2)
 */
#include <cjson/cJSON.h>

#include "testutil.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static uint64_t g_max_steps; /* 0: the default */

/* renders src with vars given as one JSON object; returns the text or "ERROR: message" */
static char *render(const char *src, const char *vars_json) {
    tr_error err = {0};
    tr_jinja *t = NULL;
    static char buf[4096];
    if (tr_jinja_parse(src, strlen(src), &t, &err)) {
        snprintf(buf, sizeof buf, "ERROR: %s", err.msg);
        return strdup(buf);
    }
    tr_jinja_var v = {.name = "vars", .kind = TR_JINJA_JSON_VARS, .text = vars_json};
    tr_jinja_opts o = {0};
    o.has_now = true;
    o.max_steps = g_max_steps;
    o.now = (struct tm){.tm_year = 125, .tm_mon = 0, .tm_mday = 15, .tm_hour = 12, .tm_wday = 3, .tm_yday = 14};
    char *out = NULL;
    size_t len;
    const tr_status st = tr_jinja_render(t, vars_json ? &v : NULL, vars_json ? 1 : 0, &o, &out, &len, &err);
    tr_jinja_free(t);
    if (st) {
        snprintf(buf, sizeof buf, "ERROR: %s", err.msg);
        return strdup(buf);
    }
    return out;
}

#define EXPECT(src, vars, want)                                                                    \
    do {                                                                                           \
        char *got_ = render(src, vars);                                                            \
        TU_CHECK(!strcmp(got_, want), "%s\n  want %s\n  got  %s", src, want, got_);                \
        free(got_);                                                                                \
    } while (0)

/* the error message starts with `want` */
#define EXPECT_ERR(src, vars, want)                                                                \
    do {                                                                                           \
        char *got_ = render(src, vars);                                                            \
        TU_CHECK(!strncmp(got_, "ERROR: " want, strlen("ERROR: " want)), "%s\n  want ERROR: %s\n  got  %s", \
                 src, want, got_);                                                                 \
        free(got_);                                                                                \
    } while (0)

/* ---- values ----------------------------------------------------------------------------------- */

static void test_values(void) {
    /* float.__repr__: shortest round trip, exponent beyond 16 digits or below 1e-4 */
    EXPECT("{{ 1.0 }} {{ 0.1 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 1/3 }}", NULL,
           "1.0 0.1 1e+16 1000000000000000.0 0.0001 1e-05 -0.0 0.3333333333333333");
    EXPECT("{{ 1.5e300 * 1e10 }} {{ 2 ** 0.5 }} {{ 123456789.123 }} {{ 1.5e-7 }}", NULL,
           "inf 1.4142135623730951 123456789.123 1.5e-07");
    /* str() of containers is repr() of the items: Python's quote choice and escapes */
    EXPECT("{{ ['a', \"b'c\", 'd\"e', 'f\\'g\"h', none, true, 1.5, (1,), ()] }}", NULL,
           "['a', \"b'c\", 'd\"e', 'f\\'g\"h', None, True, 1.5, (1,), ()]");
    EXPECT("{{ ['\\u00a0\\x00\\t\\n\\u2028é\\U0001F600\\x7f'] }}", NULL,
           "['\\xa0\\x00\\t\\n\\u2028é😀\\x7f']");
    EXPECT("{{ {'a': 1, 2: [3], none: {}} }}", NULL, "{'a': 1, 2: [3], None: {}}");
    EXPECT("{{ {'a': 1}.items() }} {{ {'a': 1}.keys() }} {{ range(3) }} {{ range(1, 9, 2) }}", NULL,
           "dict_items([('a', 1)]) dict_keys(['a']) range(0, 3) range(1, 9, 2)");
    /* `in` a dict_items view: only a 2-tuple can be in it, and only its key is hashed */
    EXPECT("{{ ('a', 1) in {'a': 1}.items() }} {{ ['a', 1] in {'a': 1}.items() }} {{ 'a' in {'a': 1}.items() }} "
           "{{ ('a', [2]) in {'a': 1}.items() }} {{ ['x'] in {'a': 1}.values() }}", NULL,
           "True False False False False");
    EXPECT_ERR("{{ (['x'], 1) in {'a': 1}.items() }}", NULL, "unhashable type: 'list' (TypeError");
    EXPECT_ERR("{{ ['x'] in {'a': 1}.keys() }}", NULL, "unhashable type: 'list' (TypeError");
    /* Python's == and dict keys: 1, 1.0 and True are one key */
    EXPECT("{{ 1 == 1.0 }} {{ true == 1 }} {{ {1: 'a', 1.0: 'b', true: 'c'} }} {{ [1, 2] == [1, 2] }} {{ (1,) == [1] }}",
           NULL, "True True {1: 'c'} True False");
    EXPECT("{{ 'a' < 'b' < 'c' }} {{ [1, 2] < [1, 3] }} {{ 2 > 1.5 }}", NULL, "True True True");
    EXPECT_ERR("{{ 1 < 'a' }}", NULL, "'<' not supported between instances of 'int' and 'str' (TypeError");
    EXPECT_ERR("{{ {[1]: 2} }}", NULL, "unhashable type: 'list' (TypeError");
    /* arithmetic */
    EXPECT("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}", NULL,
           "3 -4 2 3.0 0.5 1024 0.5");
    EXPECT("{{ 'ab' * 2 }} {{ [1] * 3 }} {{ 'x' ~ 1 ~ none ~ [1] }} {{ '%s-%05.1f-%d' % ('a', 3.14159, 7) }}", NULL,
           "abab [1, 1, 1] x1None[1] a-003.1-7");
    EXPECT_ERR("{{ 'a' + 1 }}", NULL, "can only concatenate str (not \"int\") to str (TypeError");
    EXPECT_ERR("{{ 1 + 'a' }}", NULL, "unsupported operand type(s) for +: 'int' and 'str' (TypeError");
    EXPECT_ERR("{{ 1 // 0 }}", NULL, "integer division or modulo by zero (ZeroDivisionError");
    EXPECT_ERR("{{ 9223372036854775807 + 1 }}", NULL, "integer arithmetic beyond 64 bits");
}

static void test_json(void) {
    /* json.loads keeps int and float apart and the key order; json.dumps as HF's tojson */
    EXPECT("{{ x | tojson }}", "{\"x\": {\"b\": 1, \"a\": [1.0, 2, null, true, \"é\\n\\u0001\"]}}",
           "{\"b\": 1, \"a\": [1.0, 2, null, true, \"é\\n\\u0001\"]}");
    EXPECT("{{ x | tojson(indent=2) }}", "{\"x\": {\"a\": [1, {}], \"b\": []}}",
           "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    EXPECT("{{ x | tojson(separators=(',', ':'), sort_keys=true) }} {{ 'é' | tojson(true) }} {{ '😀' | tojson(ensure_ascii=true) }}",
           "{\"x\": {\"b\": 1, \"a\": 2}}", "{\"a\":2,\"b\":1} \"\\u00e9\" \"\\ud83d\\ude00\"");
    EXPECT("{{ x }}", "{\"x\": {\"k\": 1, \"k\": 2, \"j\": 3}}", "{'k': 2, 'j': 3}");
    EXPECT("{{ x }} {{ y }}", "{\"x\": \"\\ud83d\\ude00\", \"y\": -0.0}", "😀 -0.0");
    EXPECT_ERR("{{ x | tojson }}", NULL, "Object of type Undefined is not JSON serializable (TypeError");
    EXPECT_ERR("{{ 1 }}", "{\"x\": [1,]}", "vars: invalid value at byte 9 (JSONDecodeError");
    EXPECT_ERR("{{ 1 }}", "{\"x\": \"\\ud800\"}", "vars: a lone surrogate");
}

/* ---- lexer, scoping, statements --------------------------------------------------------------- */

static void test_syntax(void) {
    /* lstrip_blocks / trim_blocks and the - and + markers */
    EXPECT("  {% if true %}\n  x\n  {% endif %}\n  y\n", NULL, "  x\n  y");
    EXPECT("a  {%- if true -%}  b  {%- endif %}\nc\n\n", NULL, "abc\n");
    EXPECT("{# c #}\n  {#- c -#}  x {{- 1 -}} \n y", NULL, "x1y");
    EXPECT("{% raw %}{{ x }}{% endraw %}\n{%+ if true +%}\n z{% endif %}", NULL, "{{ x }}\n z");
    EXPECT("l1\r\nl2\r{{ 'a\r\nb' }}\n", NULL, "l1\nl2\na\nb");
    EXPECT("{{ 'a\\d\\x41\\u00e9\\101\\'' }} {{ 'a' 'b' }} {{ 0x1f }} {{ 1_000 }} {{ 1e3 }}", NULL,
           "a\\dAéA' ab 31 1000 1000.0");
    /* scoping: a set in a loop body is gone in the next iteration and after the loop */
    EXPECT("{% set x = 'o' %}{% for i in range(3) %}{% if i == 0 %}{% set x = 'a' %}{% endif %}[{{ x }}]{% endfor %}{{ x }}",
           NULL, "[a][o][o]o");
    EXPECT("{% set ns = namespace(a=1) %}{% for i in [1, 2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}", NULL, "4");
    /* macros see their defining frame as it is at call time, and render variables */
    EXPECT("{% set y = 1 %}{% macro m() %}{{ y }}{% endmacro %}{% set y = 2 %}{{ m() }}", NULL, "2");
    EXPECT("{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 2, 3, k=4) }}",
           NULL, "11!(){}|12(3,){'k': 4}");
    EXPECT("{% macro m() %}<{{ caller(1) }}>{% endmacro %}{% call(v) m() %}body{{ v }}{% endcall %}", NULL, "<body1>");
    EXPECT("{% for x in [[1, [2]], [3]] recursive %}[{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}]{% endfor %}",
           NULL, "[[1][[2]]][[3]]");
    EXPECT("{% for a in [1, 2, 3] if a > 1 %}{{ loop.index }}/{{ loop.length }}{{ loop.last }} {% else %}E{% endfor %}", NULL,
           "1/2False 2/2True ");
    EXPECT("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% if x == 3 %}{% break %}{% endif %}{% endfor %}",
           NULL, "13");
    EXPECT("{% with a = 1 %}{% set b = 2 %}{{ a }}{% endwith %}[{{ a }}{{ b }}]{% filter upper %}ab{% endfilter %}", NULL,
           "1[]AB");
    EXPECT("{% set x | upper %}a{{ 1 }}{% endset %}{{ x }}{% generation %}{% set q = 1 %}g{% endgeneration %}{{ q }}", NULL,
           "A1g");
    /* lazy generators: truthy when empty, single pass, no length */
    EXPECT("{% set g = x | map('upper') %}{{ g | list }}{{ g | list }}{% if [] | select %}T{% endif %}",
           "{\"x\": [\"a\", \"b\"]}", "['A', 'B'][]T");
    EXPECT_ERR("{{ [1] | select | length }}", NULL, "object of type 'generator' has no len() (TypeError");
    /* jinja2's syntax errors and compile-time checks */
    EXPECT_ERR("{% if x %}", NULL,
               "Unexpected end of template. Jinja was looking for the following tags: 'elif' or 'else' or 'endif'. "
               "The innermost block that needs to be closed is 'if'. (TemplateSyntaxError, template line 1)");
    EXPECT_ERR("{% do x %}", NULL, "Encountered unknown tag 'do'. (TemplateSyntaxError");
    EXPECT_ERR("{{ x + }}", NULL, "unexpected 'end of print statement' (TemplateSyntaxError");
    EXPECT_ERR("\n\n{{ x | nosuch }}", NULL, "No filter named 'nosuch'. (TemplateAssertionError, template line 3)");
    EXPECT("{% if x %}{{ x | nosuch }}{% endif %}ok", NULL, "ok");
    EXPECT_ERR("{% if true %}{{ 1 | nosuch }}{% endif %}", NULL, "No filter named 'nosuch' found. (TemplateRuntimeError");
    EXPECT_ERR("{{ 'a\\x4' }}", NULL, "truncated \\xXX escape (TemplateSyntaxError");
    EXPECT_ERR("{% block b %}{% endblock %}", NULL, "the {% block %} statement (unsupported");
}

static void test_errors(void) {
    EXPECT("{{ x.y }}|{{ none.y }}|{{ x[5] }}|{{ x.y is defined }}", "{\"x\": {}}", "|||False");
    EXPECT_ERR("{{ x.y.z }}", "{\"x\": {}}", "'dict object' has no attribute 'y' (UndefinedError");
    EXPECT_ERR("{{ none.x.y }}", NULL, "'None' has no attribute 'x' (UndefinedError");
    EXPECT_ERR("{{ x[0].a }}", "{\"x\": []}", "list object has no element 0 (UndefinedError");
    EXPECT_ERR("{{ u + 1 }}", NULL, "'u' is undefined (UndefinedError");
    EXPECT_ERR("{{ raise_exception('System role not supported') }}", NULL,
               "System role not supported (TemplateError, template line 1)");
    EXPECT_ERR("{{ [1].append(2) }}", NULL, "access to attribute 'append' of 'list' object is unsafe. (SecurityError");
    EXPECT_ERR("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, "macro 'm' takes not more than 1 argument(s) (TypeError");
    EXPECT_ERR("{{ range(200000) | length }}", NULL, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    EXPECT_ERR("{% for x in none %}{% endfor %}", NULL, "'NoneType' object is not iterable (TypeError");
    EXPECT_ERR("{{ x.items }}", "{\"x\": {}}", "printing a function");
    /* limits: steps, memory, recursion */
    g_max_steps = 100000;
    EXPECT_ERR("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL,
               "the template ran more than 100000 evaluation steps (ResourceLimit");
    g_max_steps = 0;
    EXPECT_ERR("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL,
               "the template needs more than 256 MiB of working memory (MemoryError");
    EXPECT_ERR("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", NULL, "maximum recursion depth exceeded");
    /* input validation */
    tr_error err = {0};
    tr_jinja *t = NULL;
    TU_CHECK(tr_jinja_parse("\xff", 1, &t, &err) == TR_E_FORMAT && !t, "invalid UTF-8 accepted");
    TU_CHECK(tr_jinja_parse("{{ 1 }}", 7, NULL, &err) == TR_E_ARG, "NULL out accepted");
}

static void test_strings(void) {
    EXPECT("{{ 'ǆemal ßtraße ΣΑΣ'.upper() }}|{{ 'ǅ ΣΑΣ Σ'.lower() }}|{{ 'ǆemal ßtraße'.capitalize() }}|{{ 'hello wORLD'.title() }}",
           NULL, "ǄEMAL SSTRASSE ΣΑΣ|ǆ σας σ|ǅemal ßtraße|Hello World");
    EXPECT("{{ ' a  b '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a b c'.split(' ', 1) }}{{ 'a b c'.rsplit(' ', 1) }}", NULL,
           "['a', 'b']['a', 'b', '', 'c']['a', 'b c']['a b', 'c']");
    EXPECT("{{ '\\u3000x\\xa0'.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'héllo'[1:3] }}|{{ 'héllo'[::-1] }}|{{ 'héllo'.find('l') }}",
           NULL, "x|a|él|olléh|2");
    EXPECT("{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'ab'.center(6, '*') }}{{ '7'.zfill(3) }}{{ 'a-b'.partition('-') }}", NULL,
           "['a', 'b', 'c']**ab**007('a', '-', 'b')");
    EXPECT("{{ 'x'.startswith(('a', 'x')) }}{{ 'abc'.endswith('bc', 1) }}{{ '{} {x}'.format(1, x=2) }}{{ 'aaa'.count('a') }}",
           NULL, "TrueTrue1 23");
    EXPECT("{{ 'a b'|title }}{{ ' x '|trim }}{{ 'aXbX'|replace('X', 'y', 1) }}{{ 'a\\nb'|indent(2, true) }}{{ 'ab c'|wordcount }}",
           NULL, "A BxaybX  a\n  b2");
    EXPECT("{{ ['b', 'A', 'a']|sort }}{{ ['b', 'A', 'a']|unique|list }}{{ {'b': 1, 'A': 2}|dictsort }}{{ [3, 1, 2]|max }}",
           NULL, "['A', 'a', 'b']['b', 'A'][('A', 2), ('b', 1)]3");
    EXPECT("{{ '42'|int }}{{ '4.7'|int }}{{ ' 0x1f '|int(0, 0) }}{{ 'x'|float }}{{ 2.5|round }}{{ 2.675|round(2) }}{{ 3.1|round(0, 'ceil') }}",
           NULL, "424310.02.02.674.0");
}

/* ---- the chat-template API -------------------------------------------------------------------- */

static void test_chat_api(void) {
    tr_error err = {0};
    tr_chat_template *t = NULL;
    char *out = NULL;
    const tr_chat_message msgs[] = {{"system", "S"}, {"user", "Hi \"there\"\n"}};
    TU_CHECK(!tr_chat_template_from_string(
                 "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}{{ tools }}{{ documents }}{{ x }}",
                 "<s>", NULL, &t, &err),
             "%s", err.msg);
    TU_CHECK(!tr_chat_template_apply(t, msgs, 2, NULL, "{\"x\": 1, \"tools\": []}", true, NULL, &out, &err), "%s", err.msg);
    TU_CHECK(out && !strcmp(out, "<s><system>S<user>Hi \"there\"\n<assistant>[]None1"), "got %s", out);
    tr_free(out);
    out = NULL;
    TU_CHECK(!tr_chat_template_apply(t, NULL, 0, "[{\"role\": \"user\", \"content\": [1, {\"a\": 2}]}]", NULL, false,
                                     NULL, &out, &err),
             "%s", err.msg);
    TU_CHECK(out && !strcmp(out, "<s><user>[1, {'a': 2}]NoneNone"), "got %s", out);
    tr_free(out);
    out = NULL;
    TU_CHECK(tr_chat_template_apply(t, NULL, 0, "[1,", NULL, false, NULL, &out, &err) == TR_E_ARG && !out,
             "malformed messages accepted");
    TU_CHECK(tr_chat_template_apply(t, NULL, 0, "[]", "[1]", false, NULL, &out, &err) == TR_E_ARG, "a context that is not an object");
    TU_CHECK(tr_chat_template_apply(t, msgs, 2, NULL, NULL, false, "2025-13-01T00:00:00", &out, &err) == TR_E_ARG,
             "a bad --now accepted");
    const tr_chat_message bad[] = {{"user", "\xc3("}};
    TU_CHECK(tr_chat_template_apply(t, bad, 1, NULL, NULL, false, NULL, &out, &err) == TR_E_ARG, "invalid UTF-8 accepted");
    TU_CHECK(tr_chat_template_name(t) && tr_chat_template_source(t), "name/source");
    tr_chat_template_free(t);

    /* strftime_now with a fixed clock */
    TU_CHECK(!tr_chat_template_from_string("{{ strftime_now('%d %b %Y, %A %H:%M') }}", NULL, NULL, &t, &err), "%s", err.msg);
    TU_CHECK(!tr_chat_template_apply(t, NULL, 0, "[]", NULL, false, "2024-02-29T23:05:00", &out, &err), "%s", err.msg);
    TU_CHECK(out && !strcmp(out, "29 Feb 2024, Thursday 23:05"), "got %s", out);
    tr_free(out);
    tr_chat_template_free(t);

    /* a template error keeps jinja2's message */
    TU_CHECK(!tr_chat_template_from_string("{{ raise_exception('no ' ~ messages[0].role) }}", NULL, NULL, &t, &err), "%s", err.msg);
    TU_CHECK(tr_chat_template_apply(t, msgs, 1, NULL, NULL, false, NULL, &out, &err) == TR_E_FORMAT &&
                 !strncmp(err.msg, "no system (TemplateError", 24),
             "got %s", err.msg);
    tr_chat_template_free(t);
    TU_CHECK(tr_chat_template_from_string("{% for %}", NULL, NULL, &t, &err) == TR_E_FORMAT && !t, "syntax error accepted");
}

/* ---- the reasoning splitter ------------------------------------------------------------------- */

/* feeds text one byte at a time; checks the collected reasoning and answer */
static void split_case(const char *tmpl, const char *prompt, const char *text, const char *want_r, const char *want_a) {
    tr_error err = {0};
    tr_chat_template *t = NULL;
    if (tmpl && tr_chat_template_from_string(tmpl, NULL, NULL, &t, &err)) {
        TU_CHECK(0, "%s", err.msg);
        return;
    }
    tr_reasoning *r = NULL;
    TU_CHECK(!tr_reasoning_create(t, prompt, TR_REASONING_AUTO, &r, &err), "%s", err.msg);
    char rs[1024] = "", as[1024] = "";
    tr_reasoning_delta d;
    for (const char *p = text; *p; p++) {
        TU_CHECK(!tr_reasoning_feed(r, p, 1, &d, &err), "%s", err.msg);
        strncat(rs, d.reasoning, d.reasoning_len);
        strncat(as, d.answer, d.answer_len);
    }
    TU_CHECK(!tr_reasoning_finish(r, &d, &err), "%s", err.msg);
    strncat(rs, d.reasoning, d.reasoning_len);
    strncat(as, d.answer, d.answer_len);
    TU_CHECK(!strcmp(rs, want_r) && !strcmp(as, want_a), "%s\n  want [%s] [%s]\n  got  [%s] [%s]", text, want_r,
             want_a, rs, as);
    size_t n;
    TU_CHECK(!strcmp(tr_reasoning_text(r, &n), want_r) && !strcmp(tr_reasoning_answer(r, &n), want_a), "totals");
    tr_reasoning_free(r);
    tr_chat_template_free(t);
}

static void test_reasoning(void) {
    const char *harmony = "{{ '<|start|>assistant<|channel|>final<|message|>' }}";
    split_case(NULL, NULL, "plain <b>text</b>", "", "plain <b>text</b>");
    split_case(NULL, "<|im_start|>assistant\n", "<think>\nLet me see.\n\n</think>\n\nIt is 4.", "Let me see.", "It is 4.");
    split_case(NULL, "<think>\n", "first\nsecond </think> done", "first\nsecond", "done");
    split_case(NULL, "<think>\n\n</think>\n\n", "Answer <think>x</think>", "", "Answer <think>x</think>");
    split_case(NULL, NULL, "  <thin", "", "<thin");
    split_case(harmony, "<|start|>assistant",
               "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>",
               "User says hi.", "Hello!");
    split_case(harmony, "<|start|>assistant",
               "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}<|call|>", "", "{\"a\":1}");
    split_case(harmony, "<|start|>assistant", "no header at all", "", "no header at all");
    split_case(harmony, "<|start|>assistant<|channel|>analysis<|message|>", "thinking<|end|>", "thinking", "");
    tr_reasoning *r = NULL;
    tr_error err = {0};
    TU_CHECK(!tr_reasoning_create(NULL, "<think>", TR_REASONING_NONE, &r, &err), "%s", err.msg);
    tr_reasoning_delta d;
    TU_CHECK(!tr_reasoning_feed(r, "a</think>b", 10, &d, &err) && d.answer_len == 10 && d.reasoning_len == 0, "none format");
    tr_reasoning_free(r);
}

/* ---- batch mode for tests/py/jinja_diff.py ---------------------------------------------------- */

static int batch(const char *in_path, const char *out_path) {
    FILE *in = fopen(in_path, "r"), *out = fopen(out_path, "w");
    if (!in || !out) {
        perror("batch");
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    char *vline = NULL;
    size_t vcap = 0;
    /* two lines a case: {"t": template}, then the variables as raw JSON (re-printing them with
     * cJSON would turn 2.0 into 2) */
    while ((n = getline(&line, &cap, in)) > 0 && getline(&vline, &vcap, in) > 0) {
        cJSON *c = cJSON_Parse(line);
        const cJSON *t = cJSON_GetObjectItem(c, "t");
        char *vars = strdup(vline);
        char *res = render(cJSON_IsString(t) ? t->valuestring : "", vars);
        cJSON *o = cJSON_CreateObject();
        if (!strncmp(res, "ERROR: ", 7)) cJSON_AddStringToObject(o, "err", res + 7);
        else cJSON_AddStringToObject(o, "ok", res);
        char *s = cJSON_PrintUnformatted(o);
        fprintf(out, "%s\n", s);
        free(s);
        free(res);
        free(vars);
        cJSON_Delete(o);
        cJSON_Delete(c);
    }
    free(line);
    free(vline);
    fclose(in);
    fclose(out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--batch")) return batch(argv[2], argv[3]);
    test_values();
    test_json();
    test_syntax();
    test_errors();
    test_strings();
    test_chat_api();
    test_reasoning();
    return tu_result("test_jinja");
}
