/*
 * The template parser: jinja2's Parser, production for production (precedence from loosest:
 * inline if, or, and, not, comparisons (chained, in, not in), + -, ~, * / // %, **, unary - +,
 * then postfix . [] () and filters | and tests `is`). Error messages are jinja2's.
 *
 * Like jinja2's compiler, an unknown filter or test is an error of the template (reported after
 * the parse, so a syntax error further down wins) unless it sits directly inside an if or an
 * inline if, where jinja2 only fails when it runs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

typedef struct parser {
    tr_jinja *t;
    jz *z;
    const jtok *tok;
    size_t n, i;
    /* jinja2's stacks for its end-of-template messages */
    const char *tag_stack[256];
    int n_tags;
    const char *const *end_stack[256];
    int n_ends;
    int loop_depth;  /* for break/continue */
    int expr_depth;
} parser;

/* the lexer's error, raised when the parser reaches it (jinja2 tokenizes as it parses) */
static void check_error(const parser *p, const jtok *t) {
    if (t->kind != JT_ERROR) return;
    p->z->line = t->line;
    jz_fail(p->z, t->err_kind, "%s", t->s->p);
}

static const jtok *cur(const parser *p) { return &p->tok[p->i]; }
static const jtok *look(const parser *p) {
    const jtok *t = &p->tok[p->i + 1 < p->n ? p->i + 1 : p->i];
    check_error(p, t);
    return t;
}
static const jtok *next_tok(parser *p) {
    const jtok *t = &p->tok[p->i];
    if (p->i + 1 < p->n) p->i++;
    check_error(p, &p->tok[p->i]);
    return t;
}

static _Noreturn void pfail(parser *p, int line, const char *fmt, ...) TR_PRINTF(3, 4);
static _Noreturn void pfail(parser *p, int line, const char *fmt, ...) {
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->z->line = line;
    jz_fail(p->z, "TemplateSyntaxError", "%s", msg);
}

static void late_fail_t(tr_jinja *t, int line, const char *kind, const char *msg) {
    if (t->has_late) return;
    t->has_late = true;
    t->late_line = line;
    snprintf(t->late_kind, sizeof t->late_kind, "%s", kind);
    snprintf(t->late_msg, sizeof t->late_msg, "%s", msg);
}

static void late_fail(parser *p, int line, const char *kind, const char *msg) { late_fail_t(p->t, line, kind, msg); }

static bool is_name(const jtok *t, const char *v) { return t->kind == JT_NAME && js_eqc(t->s, v); }

/* a token expression "name:endfor" or a token kind, as jinja2's describe_token_expr */
static const char *describe_expr(const char *e) {
    if (!strncmp(e, "name:", 5)) return e + 5;
    return e;
}

static const char *kind_desc(jt_kind k) {
    if (k == JT_NAME) return "name";
    jtok t = {.kind = (uint8_t)k};
    return jt_describe(&t);
}

static const jtok *expect(parser *p, jt_kind k) {
    const jtok *t = cur(p);
    if (t->kind != k) {
        if (t->kind == JT_EOF)
            pfail(p, t->line, "unexpected end of template, expected '%s'.", kind_desc(k));
        pfail(p, t->line, "expected token '%s', got '%s'", kind_desc(k), jt_describe(t));
    }
    return next_tok(p);
}

static void expect_name(parser *p, const char *v) {
    const jtok *t = cur(p);
    if (!is_name(t, v)) {
        if (t->kind == JT_EOF) pfail(p, t->line, "unexpected end of template, expected '%s'.", v);
        pfail(p, t->line, "expected token '%s', got '%s'", v, jt_describe(t));
    }
    next_tok(p);
}

static bool skip_if(parser *p, jt_kind k) {
    if (cur(p)->kind != k) return false;
    next_tok(p);
    return true;
}

static bool skip_name(parser *p, const char *v) {
    if (!is_name(cur(p), v)) return false;
    next_tok(p);
    return true;
}

/* ---- nodes ------------------------------------------------------------------------------------ */

static jnode *mk(parser *p, jn_kind k, int line) {
    jnode *n = jz_alloc(p->z, sizeof *n);
    n->kind = (uint8_t)k;
    n->line = line;
    return n;
}

typedef struct nvec {
    jnode **v;
    size_t n, cap;
} nvec;

static void nv_push(parser *p, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        const size_t cap = v->cap ? v->cap * 2 : 4;
        v->v = jz_grow(p->z, v->v, v->cap * sizeof *v->v, cap * sizeof *v->v);
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static jnodes nv_done(nvec v) { return (jnodes){v.v, v.n}; }

static int sym_of(parser *p, const jstr *name) {
    tr_jinja *t = p->t;
    for (size_t i = 0; i < t->nsyms; i++)
        if (js_eq(t->syms[i].name, name)) return (int)i;
    if ((t->nsyms & (t->nsyms - 1)) == 0) {
        const size_t cap = t->nsyms ? t->nsyms * 2 : 16;
        t->syms = jz_grow(p->z, t->syms, t->nsyms * sizeof *t->syms, cap * sizeof *t->syms);
    }
    t->syms[t->nsyms].name = js_new(p->z, name->p, name->len);
    t->syms[t->nsyms].global = jb_global_id(name->p);
    return (int)t->nsyms++;
}

/* ---- expressions ------------------------------------------------------------------------------ */

static jnode *parse_expression(parser *p, bool with_condexpr);
static jnode *parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                          bool explicit_parens, bool with_namespace);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p, bool with_namespace);
static jnode *parse_postfix(parser *p, jnode *node);
static jnode *parse_filter_expr(parser *p, jnode *node);
static jnode *parse_filter(parser *p, jnode *node, bool start_inline);

static void enter_expr(parser *p) {
    if (++p->expr_depth > 150) {
        p->z->line = cur(p)->line;
        jz_unsupported(p->z, "expressions nested more than 150 deep");
    }
}

static jnode *parse_condexpr(parser *p);

static jnode *parse_or(parser *p);

static jnode *parse_expression(parser *p, bool with_condexpr) {
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static jnode *parse_condexpr(parser *p) {
    enter_expr(p);
    int line = cur(p)->line;
    jnode *e1 = parse_or(p);
    while (skip_name(p, "if")) {
        jnode *e2 = parse_or(p);
        jnode *e3 = NULL;
        if (skip_name(p, "else")) e3 = parse_condexpr(p);
        jnode *c = mk(p, JN_CONDEXPR, line);
        c->cond.cond = e2;
        c->cond.a = e1;
        c->cond.b = e3;
        e1 = c;
        line = cur(p)->line;
    }
    p->expr_depth--;
    return e1;
}

static jnode *bin(parser *p, jn_kind k, jnode *a, jnode *b, int line) {
    jnode *n = mk(p, k, line);
    n->bin.a = a;
    n->bin.b = b;
    return n;
}

static jnode *parse_not(parser *p);

static jnode *parse_and(parser *p) {
    int line = cur(p)->line;
    jnode *left = parse_not(p);
    while (skip_name(p, "and")) {
        left = bin(p, JN_AND, left, parse_not(p), line);
        line = cur(p)->line;
    }
    return left;
}

static jnode *parse_or(parser *p) {
    int line = cur(p)->line;
    jnode *left = parse_and(p);
    while (skip_name(p, "or")) {
        left = bin(p, JN_OR, left, parse_and(p), line);
        line = cur(p)->line;
    }
    return left;
}

static jnode *parse_compare(parser *p);

static jnode *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        const int line = next_tok(p)->line;
        enter_expr(p);
        jnode *n = mk(p, JN_NOT, line);
        n->bin.a = parse_not(p);
        p->expr_depth--;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_math1(parser *p);

static jnode *parse_compare(parser *p) {
    int line = cur(p)->line;
    jnode *expr = parse_math1(p);
    jop ops[64];
    jnode *rest[64];
    size_t n = 0;
    for (;;) {
        const jtok *t = cur(p);
        jop op;
        if (t->kind == JT_EQ) op = JOP_EQ;
        else if (t->kind == JT_NE) op = JOP_NE;
        else if (t->kind == JT_LT) op = JOP_LT;
        else if (t->kind == JT_LTEQ) op = JOP_LE;
        else if (t->kind == JT_GT) op = JOP_GT;
        else if (t->kind == JT_GTEQ) op = JOP_GE;
        else if (is_name(t, "in")) op = JOP_IN;
        else if (is_name(t, "not") && is_name(look(p), "in")) op = JOP_NOTIN;
        else break;
        next_tok(p);
        if (op == JOP_NOTIN) next_tok(p);
        if (n == 64) {
            p->z->line = t->line;
            jz_unsupported(p->z, "more than 64 chained comparisons");
        }
        ops[n] = op;
        rest[n++] = parse_math1(p);
        line = cur(p)->line;
    }
    if (!n) return expr;
    jnode *c = mk(p, JN_COMPARE, line);
    c->cmp.first = expr;
    c->cmp.n = n;
    c->cmp.ops = jz_alloc(p->z, n * sizeof *ops);
    c->cmp.rest = jz_alloc(p->z, n * sizeof *rest);
    memcpy(c->cmp.ops, ops, n * sizeof *ops);
    memcpy(c->cmp.rest, rest, n * sizeof *rest);
    return c;
}

static jnode *binop(parser *p, jop op, jnode *a, jnode *b, int line) {
    jnode *n = bin(p, JN_BINOP, a, b, line);
    n->op = (uint8_t)op;
    return n;
}

static jnode *parse_concat(parser *p);

static jnode *parse_math1(parser *p) {
    int line = cur(p)->line;
    jnode *left = parse_concat(p);
    while (cur(p)->kind == JT_ADD || cur(p)->kind == JT_SUB) {
        const jop op = next_tok(p)->kind == JT_ADD ? JOP_ADD : JOP_SUB;
        left = binop(p, op, left, parse_concat(p), line);
        line = cur(p)->line;
    }
    return left;
}

static jnode *parse_math2(parser *p);

static jnode *parse_concat(parser *p) {
    const int line = cur(p)->line;
    jnode *first = parse_math2(p);
    if (cur(p)->kind != JT_TILDE) return first;
    nvec v = {0};
    nv_push(p, &v, first);
    while (skip_if(p, JT_TILDE)) nv_push(p, &v, parse_math2(p));
    jnode *n = mk(p, JN_CONCAT, line);
    n->items = nv_done(v);
    return n;
}

static jnode *parse_pow(parser *p);

static jnode *parse_math2(parser *p) {
    int line = cur(p)->line;
    jnode *left = parse_pow(p);
    for (;;) {
        const jt_kind k = (jt_kind)cur(p)->kind;
        jop op;
        if (k == JT_MUL) op = JOP_MUL;
        else if (k == JT_DIV) op = JOP_DIV;
        else if (k == JT_FLOORDIV) op = JOP_FLOORDIV;
        else if (k == JT_MOD) op = JOP_MOD;
        else break;
        next_tok(p);
        left = binop(p, op, left, parse_pow(p), line);
        line = cur(p)->line;
    }
    return left;
}

static jnode *parse_pow(parser *p) {
    int line = cur(p)->line;
    jnode *left = parse_unary(p, true);
    while (skip_if(p, JT_POW)) {
        left = binop(p, JOP_POW, left, parse_unary(p, true), line);
        line = cur(p)->line;
    }
    return left;
}

static jnode *parse_unary(parser *p, bool with_filter) {
    enter_expr(p);
    const jtok *t = cur(p);
    jnode *node;
    if (t->kind == JT_SUB || t->kind == JT_ADD) {
        next_tok(p);
        node = mk(p, t->kind == JT_SUB ? JN_NEG : JN_POS, t->line);
        node->bin.a = parse_unary(p, false);
    } else {
        node = parse_primary(p, false);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    p->expr_depth--;
    return node;
}

static jnode *parse_list(parser *p) {
    const int line = expect(p, JT_LBRACKET)->line;
    nvec v = {0};
    while (cur(p)->kind != JT_RBRACKET) {
        if (v.n) expect(p, JT_COMMA);
        if (cur(p)->kind == JT_RBRACKET) break;
        nv_push(p, &v, parse_expression(p, true));
    }
    expect(p, JT_RBRACKET);
    jnode *n = mk(p, JN_LIST, line);
    n->items = nv_done(v);
    return n;
}

static jnode *parse_dict(parser *p) {
    const int line = expect(p, JT_LBRACE)->line;
    nvec k = {0}, v = {0};
    while (cur(p)->kind != JT_RBRACE) {
        if (k.n) expect(p, JT_COMMA);
        if (cur(p)->kind == JT_RBRACE) break;
        nv_push(p, &k, parse_expression(p, true));
        expect(p, JT_COLON);
        nv_push(p, &v, parse_expression(p, true));
    }
    expect(p, JT_RBRACE);
    jnode *n = mk(p, JN_DICT, line);
    n->dict.keys = nv_done(k);
    n->dict.vals = nv_done(v);
    return n;
}

static jnode *parse_primary(parser *p, bool with_namespace) {
    const jtok *t = cur(p);
    jnode *node;
    if (t->kind == JT_NAME) {
        next_tok(p);
        if (js_eqc(t->s, "true") || js_eqc(t->s, "True") || js_eqc(t->s, "false") || js_eqc(t->s, "False")) {
            node = mk(p, JN_CONST, t->line);
            node->value = jv_bool(t->s->p[0] == 't' || t->s->p[0] == 'T');
        } else if (js_eqc(t->s, "none") || js_eqc(t->s, "None")) {
            node = mk(p, JN_CONST, t->line);
            node->value = JV_NONE_V;
        } else if (with_namespace && cur(p)->kind == JT_DOT) {
            next_tok(p);
            const jtok *attr = expect(p, JT_NAME);
            node = mk(p, JN_NSREF, t->line);
            node->nsref.sym = sym_of(p, t->s);
            node->nsref.attr = attr->s;
        } else {
            node = mk(p, JN_NAME, t->line);
            node->name.sym = sym_of(p, t->s);
        }
    } else if (t->kind == JT_STRING) {
        next_tok(p);
        jstr *s = t->s;
        if (cur(p)->kind == JT_STRING) {
            jbuf b = {0};
            jb_put(p->z, &b, s->p, s->len);
            while (cur(p)->kind == JT_STRING) {
                const jtok *u = next_tok(p);
                jb_put(p->z, &b, u->s->p, u->s->len);
            }
            s = js_new(p->z, b.p, b.len);
        }
        node = mk(p, JN_CONST, t->line);
        node->value = jv_of_str(s);
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        next_tok(p);
        node = mk(p, JN_CONST, t->line);
        node->value = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
    } else if (t->kind == JT_LPAREN) {
        next_tok(p);
        node = parse_tuple(p, false, true, NULL, true, false);
        expect(p, JT_RPAREN);
    } else if (t->kind == JT_LBRACKET) {
        node = parse_list(p);
    } else if (t->kind == JT_LBRACE) {
        node = parse_dict(p);
    } else {
        pfail(p, t->line, "unexpected '%s'", jt_describe(t));
    }
    return node;
}

static bool is_tuple_end(parser *p, const char *extra) {
    const jtok *t = cur(p);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || t->kind == JT_RPAREN) return true;
    return extra && is_name(t, extra);
}

static jnode *parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                          bool explicit_parens, bool with_namespace) {
    int line = cur(p)->line;
    nvec v = {0};
    bool is_tuple = false;
    for (;;) {
        if (v.n) expect(p, JT_COMMA);
        if (is_tuple_end(p, extra_end)) break;
        nv_push(p, &v, simplified ? parse_primary(p, with_namespace) : parse_expression(p, with_condexpr));
        if (cur(p)->kind == JT_COMMA) is_tuple = true;
        else break;
        line = cur(p)->line;
    }
    if (!is_tuple) {
        if (v.n) return v.v[0];
        if (!explicit_parens)
            pfail(p, cur(p)->line, "Expected an expression, got '%s'", jt_describe(cur(p)));
    }
    jnode *n = mk(p, JN_TUPLE, line);
    n->items = nv_done(v);
    return n;
}

static jnode *parse_subscribed(parser *p) {
    const int line = cur(p)->line;
    jnode *args[3] = {NULL, NULL, NULL};
    if (cur(p)->kind == JT_COLON) {
        next_tok(p);
    } else {
        jnode *node = parse_expression(p, true);
        if (cur(p)->kind != JT_COLON) return node;
        next_tok(p);
        args[0] = node;
    }
    if (cur(p)->kind != JT_COLON && cur(p)->kind != JT_RBRACKET && cur(p)->kind != JT_COMMA)
        args[1] = parse_expression(p, true);
    if (cur(p)->kind == JT_COLON) {
        next_tok(p);
        if (cur(p)->kind != JT_RBRACKET && cur(p)->kind != JT_COMMA) args[2] = parse_expression(p, true);
    }
    jnode *n = mk(p, JN_SLICE, line);
    n->slice.start = args[0];
    n->slice.stop = args[1];
    n->slice.step = args[2];
    return n;
}

static jnode *parse_subscript(parser *p, jnode *node) {
    const jtok *t = next_tok(p);
    if (t->kind == JT_DOT) {
        const jtok *a = next_tok(p);
        if (a->kind == JT_NAME) {
            jnode *n = mk(p, JN_GETATTR, t->line);
            n->getattr.obj = node;
            n->getattr.attr = a->s;
            return n;
        }
        if (a->kind != JT_INT) pfail(p, a->line, "expected name or number");
        jnode *c = mk(p, JN_CONST, a->line);
        c->value = jv_int(a->i);
        jnode *n = mk(p, JN_GETITEM, t->line);
        n->getitem.obj = node;
        n->getitem.arg = c;
        return n;
    }
    /* [ */
    nvec v = {0};
    while (cur(p)->kind != JT_RBRACKET) {
        if (v.n) expect(p, JT_COMMA);
        nv_push(p, &v, parse_subscribed(p));
    }
    expect(p, JT_RBRACKET);
    jnode *arg;
    if (v.n == 1) {
        arg = v.v[0];
    } else {
        arg = mk(p, JN_TUPLE, t->line);
        arg->items = nv_done(v);
    }
    jnode *n = mk(p, JN_GETITEM, t->line);
    n->getitem.obj = node;
    n->getitem.arg = arg;
    return n;
}

static jargs parse_call_args(parser *p) {
    const jtok *lp = expect(p, JT_LPAREN);
    nvec pos = {0};
    jkwarg kw[64];
    size_t nkw = 0;
    jargs a = {0};
    bool require_comma = false;
    while (cur(p)->kind != JT_RPAREN) {
        if (require_comma) {
            expect(p, JT_COMMA);
            if (cur(p)->kind == JT_RPAREN) break;
        }
        if (cur(p)->kind == JT_MUL) {
            if (a.star || a.dstar) pfail(p, lp->line, "invalid syntax for function call expression");
            next_tok(p);
            a.star = parse_expression(p, true);
        } else if (cur(p)->kind == JT_POW) {
            if (a.dstar) pfail(p, lp->line, "invalid syntax for function call expression");
            next_tok(p);
            a.dstar = parse_expression(p, true);
        } else if (cur(p)->kind == JT_NAME && look(p)->kind == JT_ASSIGN) {
            if (a.dstar) pfail(p, lp->line, "invalid syntax for function call expression");
            jstr *key = cur(p)->s;
            next_tok(p);
            next_tok(p);
            if (nkw == 64) {
                p->z->line = lp->line;
                jz_unsupported(p->z, "more than 64 keyword arguments");
            }
            kw[nkw].name = key;
            kw[nkw++].value = parse_expression(p, true);
        } else {
            if (a.star || a.dstar || nkw) pfail(p, lp->line, "invalid syntax for function call expression");
            nv_push(p, &pos, parse_expression(p, true));
        }
        require_comma = true;
    }
    expect(p, JT_RPAREN);
    a.pos = nv_done(pos);
    a.nkw = nkw;
    if (nkw) {
        a.kw = jz_alloc(p->z, nkw * sizeof *kw);
        memcpy(a.kw, kw, nkw * sizeof *kw);
    }
    return a;
}

static jnode *parse_call(parser *p, jnode *node) {
    const int line = cur(p)->line;
    jnode *n = mk(p, JN_CALL, line);
    n->call.fn = node;
    n->call.args = parse_call_args(p);
    return n;
}

static jnode *parse_postfix(parser *p, jnode *node) {
    for (;;) {
        const jt_kind k = (jt_kind)cur(p)->kind;
        if (k == JT_DOT || k == JT_LBRACKET) node = parse_subscript(p, node);
        else if (k == JT_LPAREN) node = parse_call(p, node);
        else return node;
    }
}

static jstr *dotted_name(parser *p) {
    const jtok *t = expect(p, JT_NAME);
    if (cur(p)->kind != JT_DOT) return t->s;
    jbuf b = {0};
    jb_put(p->z, &b, t->s->p, t->s->len);
    while (skip_if(p, JT_DOT)) {
        jb_putc(p->z, &b, '.');
        const jtok *u = expect(p, JT_NAME);
        jb_put(p->z, &b, u->s->p, u->s->len);
    }
    return js_new(p->z, b.p, b.len);
}

static jnode *parse_filter(parser *p, jnode *node, bool start_inline) {
    while (cur(p)->kind == JT_PIPE || start_inline) {
        if (!start_inline) next_tok(p);
        const int line = cur(p)->line;
        jstr *name = dotted_name(p);
        jnode *f = mk(p, JN_FILTER, line);
        f->filter.obj = node;
        f->filter.name = name;
        f->filter.id = jb_filter_id(name->p);
        if (cur(p)->kind == JT_LPAREN) f->filter.args = parse_call_args(p);
        node = f;
        start_inline = false;
    }
    return node;
}

static jnode *parse_test(parser *p, jnode *node) {
    const jtok *is = next_tok(p);
    const bool negated = skip_name(p, "not");
    jstr *name = dotted_name(p);
    jnode *t = mk(p, JN_TEST, is->line);
    t->filter.obj = node;
    t->filter.name = name;
    t->filter.id = jb_test_id(name->p);
    const jtok *c = cur(p);
    if (c->kind == JT_LPAREN) {
        t->filter.args = parse_call_args(p);
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                c->kind == JT_LPAREN || c->kind == JT_LBRACKET || c->kind == JT_LBRACE) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(p, c->line, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(p, parse_primary(p, false));
        nvec v = {0};
        nv_push(p, &v, arg);
        t->filter.args.pos = nv_done(v);
    }
    if (negated) {
        jnode *n = mk(p, JN_NOT, is->line);
        n->bin.a = t;
        return n;
    }
    return t;
}

static jnode *parse_filter_expr(parser *p, jnode *node) {
    for (;;) {
        const jtok *t = cur(p);
        if (t->kind == JT_PIPE) node = parse_filter(p, node, false);
        else if (is_name(t, "is")) node = parse_test(p, node);
        else if (t->kind == JT_LPAREN) node = parse_call(p, node);
        else return node;
    }
}

/* ---- statements ------------------------------------------------------------------------------- */

static jnodes subparse(parser *p, const char *const *end_tokens);

static void fail_ut_eof(parser *p, const char *name, int line) {
    /* jinja2's _fail_ut_eof */
    char msg[800];
    size_t len = 0;
    if (!name) len += (size_t)snprintf(msg + len, sizeof msg - len, "Unexpected end of template.");
    else len += (size_t)snprintf(msg + len, sizeof msg - len, "Encountered unknown tag '%s'.", name);
    if (p->n_ends > 0) {
        const char *const *top = p->end_stack[p->n_ends - 1];
        char looking[300];
        size_t l = 0;
        looking[0] = '\0';
        for (int k = 0; top[k]; k++)
            l += (size_t)snprintf(looking + l, sizeof looking - l, "%s'%s'", k ? " or " : "",
                                  describe_expr(top[k]));
        bool expected = false;
        for (int s = 0; s < p->n_ends && name; s++)
            for (int k = 0; p->end_stack[s][k]; k++)
                if (!strcmp(describe_expr(p->end_stack[s][k]), name)) expected = true;
        if (expected)
            len += (size_t)snprintf(msg + len, sizeof msg - len,
                                    " You probably made a nesting mistake. Jinja is expecting this "
                                    "tag, but currently looking for %s.", looking);
        else
            len += (size_t)snprintf(msg + len, sizeof msg - len,
                                    " Jinja was looking for the following tags: %s.", looking);
    }
    if (p->n_tags > 0 && len < sizeof msg)
        snprintf(msg + len, sizeof msg - len, " The innermost block that needs to be closed is '%s'.",
                 p->tag_stack[p->n_tags - 1]);
    pfail(p, line, "%s", msg);
}

static bool test_any(const jtok *t, const char *const *ends) {
    for (int k = 0; ends[k]; k++)
        if (is_name(t, describe_expr(ends[k]))) return true;
    return false;
}

static jnodes parse_statements(parser *p, const char *const *end_tokens, bool drop_needle) {
    skip_if(p, JT_COLON);
    expect(p, JT_BLOCK_END);
    jnodes body = subparse(p, end_tokens);
    if (cur(p)->kind == JT_EOF) {
        /* fail_eof(end_tokens): the stack plus these */
        if (p->n_ends < 256) p->end_stack[p->n_ends++] = end_tokens;
        fail_ut_eof(p, NULL, cur(p)->line);
    }
    if (drop_needle) next_tok(p);
    return body;
}

static const char *const END_FOR[] = {"name:endfor", "name:else", NULL};
static const char *const END_FOR2[] = {"name:endfor", NULL};
static const char *const END_IF[] = {"name:elif", "name:else", "name:endif", NULL};
static const char *const END_IF2[] = {"name:endif", NULL};
static const char *const END_SET[] = {"name:endset", NULL};
static const char *const END_MACRO[] = {"name:endmacro", NULL};
static const char *const END_CALL[] = {"name:endcall", NULL};
static const char *const END_FILTER[] = {"name:endfilter", NULL};
static const char *const END_WITH[] = {"name:endwith", NULL};
static const char *const END_GEN[] = {"name:endgeneration", NULL};

static bool can_assign(const jnode *n) {
    if (n->kind == JN_NAME || n->kind == JN_NSREF) return true;
    if (n->kind == JN_TUPLE) {
        for (size_t i = 0; i < n->items.n; i++)
            if (!can_assign(n->items.v[i])) return false;
        return true;
    }
    return false;
}

static const char *node_type_name(const jnode *n) {
    switch ((jn_kind)n->kind) {
    case JN_CONST: return "const";
    case JN_LIST: return "list";
    case JN_DICT: return "dict";
    case JN_TUPLE: return "tuple";
    case JN_CALL: return "call";
    case JN_GETATTR: return "getattr";
    case JN_GETITEM: return "getitem";
    case JN_FILTER: return "filter";
    case JN_TEST: return "test";
    case JN_CONDEXPR: return "condexpr";
    case JN_COMPARE: return "compare";
    case JN_NOT: return "not";
    case JN_NEG: return "neg";
    case JN_POS: return "pos";
    case JN_AND: return "and";
    case JN_OR: return "or";
    case JN_CONCAT: return "concat";
    case JN_BINOP: {
        static const char *const names[] = {"add", "sub", "mul", "div", "floordiv", "mod", "pow"};
        return n->op <= JOP_POW ? names[n->op] : "binop";
    }
    default: return "expr";
    }
}

static jnode *parse_assign_target(parser *p, bool with_tuple, bool name_only, const char *extra_end,
                                  bool with_namespace) {
    jnode *target;
    if (name_only) {
        const jtok *t = expect(p, JT_NAME);
        target = mk(p, JN_NAME, t->line);
        target->name.sym = sym_of(p, t->s);
    } else if (with_tuple) {
        target = parse_tuple(p, true, true, extra_end, false, with_namespace);
    } else {
        target = parse_primary(p, with_namespace);
    }
    if (!can_assign(target))
        pfail(p, target->line, "can't assign to '%s'", node_type_name(target));
    /* true/false/none are constants, not names */
    return target;
}

/* names a target stores, for jinja2's "Can't assign to special loop variable" check */
static bool target_has_loop(const parser *p, const jnode *n) {
    if (n->kind == JN_NAME) return js_eqc(p->t->syms[n->name.sym].name, "loop");
    if (n->kind == JN_TUPLE)
        for (size_t i = 0; i < n->items.n; i++)
            if (target_has_loop(p, n->items.v[i])) return true;
    return false;
}

static jnode *parse_for(parser *p) {
    const int line = next_tok(p)->line;
    jnode *n = mk(p, JN_FOR, line);
    n->for_.target = parse_assign_target(p, true, false, "in", false);
    expect_name(p, "in");
    n->for_.iter = parse_tuple(p, false, false, "recursive", false, false);
    if (skip_name(p, "if")) n->for_.filter = parse_expression(p, true);
    n->for_.recursive = skip_name(p, "recursive");
    p->loop_depth++;
    n->for_.body = parse_statements(p, END_FOR, false);
    p->loop_depth--;
    if (js_eqc(next_tok(p)->s, "else")) n->for_.else_ = parse_statements(p, END_FOR2, true);
    if (target_has_loop(p, n->for_.target))
        late_fail(p, line, "TemplateAssertionError", "Can't assign to special loop variable in for-loop target");
    return n;
}

static jnode *parse_if(parser *p) {
    const int line = next_tok(p)->line;
    jnode *root = mk(p, JN_IF, line), *node = root;
    for (;;) {
        node->if_.test = parse_tuple(p, false, false, NULL, false, false);
        node->if_.body = parse_statements(p, END_IF, false);
        const jtok *t = next_tok(p);
        if (is_name(t, "elif")) {
            jnode *e = mk(p, JN_IF, cur(p)->line);
            e->is_elif = true;
            jnode **one = jz_alloc(p->z, sizeof *one);
            one[0] = e;
            node->if_.else_ = (jnodes){one, 1};
            node = e;
            continue;
        }
        if (is_name(t, "else")) node->if_.else_ = parse_statements(p, END_IF2, true);
        break;
    }
    return root;
}

static jnode *parse_set(parser *p) {
    const int line = next_tok(p)->line;
    jnode *target = parse_assign_target(p, true, false, NULL, true);
    if (skip_if(p, JT_ASSIGN)) {
        jnode *n = mk(p, JN_SET, line);
        n->set.target = target;
        n->set.value = parse_tuple(p, false, true, NULL, false, false);
        return n;
    }
    jnode *n = mk(p, JN_SETBLOCK, line);
    n->setblock.target = target;
    n->setblock.filter = parse_filter(p, NULL, false);
    n->setblock.body = parse_statements(p, END_SET, true);
    return n;
}

/* does the body load `name` (a name it does not declare)? jinja2 decides from this whether a
 * macro takes varargs, kwargs or a caller */
static bool uses_name(const jnode *n, int sym);

static bool uses_list(const jnodes *v, int sym) {
    for (size_t i = 0; i < v->n; i++)
        if (uses_name(v->v[i], sym)) return true;
    return false;
}

static bool uses_args(const jargs *a, int sym) {
    if (uses_list(&a->pos, sym)) return true;
    for (size_t i = 0; i < a->nkw; i++)
        if (uses_name(a->kw[i].value, sym)) return true;
    return (a->star && uses_name(a->star, sym)) || (a->dstar && uses_name(a->dstar, sym));
}

static bool uses_name(const jnode *n, int sym) {
    if (!n) return false;
    switch ((jn_kind)n->kind) {
    case JN_NAME: return n->name.sym == sym;
    case JN_OUTPUT: case JN_LIST: case JN_TUPLE: case JN_CONCAT: return uses_list(&n->items, sym);
    case JN_DICT: return uses_list(&n->dict.keys, sym) || uses_list(&n->dict.vals, sym);
    case JN_GETATTR: return uses_name(n->getattr.obj, sym);
    case JN_GETITEM: return uses_name(n->getitem.obj, sym) || uses_name(n->getitem.arg, sym);
    case JN_SLICE: return uses_name(n->slice.start, sym) || uses_name(n->slice.stop, sym) || uses_name(n->slice.step, sym);
    case JN_CALL: return uses_name(n->call.fn, sym) || uses_args(&n->call.args, sym);
    case JN_FILTER: case JN_TEST: return uses_name(n->filter.obj, sym) || uses_args(&n->filter.args, sym);
    case JN_NOT: case JN_NEG: case JN_POS: return uses_name(n->bin.a, sym);
    case JN_BINOP: case JN_AND: case JN_OR: return uses_name(n->bin.a, sym) || uses_name(n->bin.b, sym);
    case JN_COMPARE:
        if (uses_name(n->cmp.first, sym)) return true;
        for (size_t i = 0; i < n->cmp.n; i++)
            if (uses_name(n->cmp.rest[i], sym)) return true;
        return false;
    case JN_CONDEXPR: return uses_name(n->cond.cond, sym) || uses_name(n->cond.a, sym) || uses_name(n->cond.b, sym);
    case JN_IF: return uses_name(n->if_.test, sym) || uses_list(&n->if_.body, sym) || uses_list(&n->if_.else_, sym);
    case JN_FOR:
        return uses_name(n->for_.iter, sym) || uses_name(n->for_.filter, sym) ||
               uses_list(&n->for_.body, sym) || uses_list(&n->for_.else_, sym);
    case JN_SET: return uses_name(n->set.value, sym);
    case JN_SETBLOCK: return uses_name(n->setblock.filter, sym) || uses_list(&n->setblock.body, sym);
    case JN_MACRO: return uses_list(&n->macro.body, sym);
    case JN_CALLBLOCK: return uses_name(n->callblock.call, sym) || uses_name(n->callblock.macro, sym);
    case JN_FILTERBLOCK: return uses_name(n->filterblock.filter, sym) || uses_list(&n->filterblock.body, sym);
    case JN_WITH:
        for (size_t i = 0; i < n->with.n; i++)
            if (uses_name(n->with.values[i], sym)) return true;
        return uses_list(&n->with.body, sym);
    case JN_SCOPE: return uses_list(&n->scope.body, sym);
    default: return false;
    }
}

static void parse_signature(parser *p, jnode *m) {
    int params[64];
    jnode *defaults[64];
    size_t np = 0, nd = 0;
    expect(p, JT_LPAREN);
    while (cur(p)->kind != JT_RPAREN) {
        if (np) expect(p, JT_COMMA);
        const jtok *t = expect(p, JT_NAME);
        if (np == 64) {
            p->z->line = t->line;
            jz_unsupported(p->z, "macros with more than 64 parameters");
        }
        const int sym = sym_of(p, t->s);
        if (skip_if(p, JT_ASSIGN)) defaults[nd++] = parse_expression(p, true);
        else if (nd) pfail(p, cur(p)->line, "non-default argument follows default argument");
        params[np++] = sym;
    }
    expect(p, JT_RPAREN);
    m->macro.nparams = np;
    m->macro.params = jz_alloc(p->z, (np + 1) * sizeof(int));
    memcpy(m->macro.params, params, np * sizeof(int));
    m->macro.ndefaults = nd;
    m->macro.defaults = jz_alloc(p->z, (nd + 1) * sizeof(jnode *));
    memcpy(m->macro.defaults, defaults, nd * sizeof(jnode *));
}

static void macro_flags(parser *p, jnode *m) {
    jstr v = {0};
    (void)v;
    static const char *const names[3] = {"varargs", "kwargs", "caller"};
    bool *flags[3] = {&m->macro.uses_varargs, &m->macro.uses_kwargs, &m->macro.uses_caller};
    for (int k = 0; k < 3; k++) {
        int sym = -1;
        for (size_t i = 0; i < p->t->nsyms; i++)
            if (js_eqc(p->t->syms[i].name, names[k])) sym = (int)i;
        if (sym < 0) continue;
        bool param = false;
        for (size_t i = 0; i < m->macro.nparams; i++) param |= m->macro.params[i] == sym;
        *flags[k] = !param && uses_list(&m->macro.body, sym);
    }
}

static jnode *parse_macro(parser *p) {
    const int line = next_tok(p)->line;
    jnode *m = mk(p, JN_MACRO, line);
    const jtok *name = expect(p, JT_NAME);
    m->macro.name = name->s;
    m->macro.sym = sym_of(p, name->s);
    const int loops = p->loop_depth;
    p->loop_depth = 0;
    parse_signature(p, m);
    m->macro.body = parse_statements(p, END_MACRO, true);
    p->loop_depth = loops;
    macro_flags(p, m);
    return m;
}

static jnode *parse_call_block(parser *p) {
    const int line = next_tok(p)->line;
    jnode *n = mk(p, JN_CALLBLOCK, line);
    jnode *m = mk(p, JN_MACRO, line);
    m->macro.name = js_cstr(p->z, "caller");
    m->macro.sym = -1;
    if (cur(p)->kind == JT_LPAREN) parse_signature(p, m);
    else {
        m->macro.params = jz_alloc(p->z, sizeof(int));
        m->macro.defaults = jz_alloc(p->z, sizeof(jnode *));
    }
    jnode *call = parse_expression(p, true);
    if (call->kind != JN_CALL) pfail(p, line, "expected call");
    n->callblock.call = call;
    const int loops = p->loop_depth;
    p->loop_depth = 0;
    m->macro.body = parse_statements(p, END_CALL, true);
    p->loop_depth = loops;
    macro_flags(p, m);
    n->callblock.macro = m;
    return n;
}

static jnode *parse_filter_block(parser *p) {
    const int line = next_tok(p)->line;
    jnode *n = mk(p, JN_FILTERBLOCK, line);
    n->filterblock.filter = parse_filter(p, NULL, true);
    n->filterblock.body = parse_statements(p, END_FILTER, true);
    return n;
}

static jnode *parse_with(parser *p) {
    const int line = next_tok(p)->line;
    jnode *n = mk(p, JN_WITH, line);
    nvec targets = {0}, values = {0};
    while (cur(p)->kind != JT_BLOCK_END) {
        if (targets.n) expect(p, JT_COMMA);
        nv_push(p, &targets, parse_assign_target(p, true, false, NULL, false));
        expect(p, JT_ASSIGN);
        nv_push(p, &values, parse_expression(p, true));
    }
    n->with.targets = targets.v;
    n->with.values = values.v;
    n->with.n = targets.n;
    n->with.body = parse_statements(p, END_WITH, true);
    return n;
}

static jnode *parse_statement(parser *p) {
    const jtok *t = cur(p);
    if (t->kind != JT_NAME) pfail(p, t->line, "tag name expected");
    const char *name = t->s->p;
    if (p->n_tags == 256) {
        p->z->line = t->line;
        jz_unsupported(p->z, "blocks nested more than 256 deep");
    }
    p->tag_stack[p->n_tags++] = name;
    jnode *r = NULL;
    if (!strcmp(name, "for")) r = parse_for(p);
    else if (!strcmp(name, "if")) r = parse_if(p);
    else if (!strcmp(name, "set")) r = parse_set(p);
    else if (!strcmp(name, "macro")) r = parse_macro(p);
    else if (!strcmp(name, "call")) r = parse_call_block(p);
    else if (!strcmp(name, "filter")) r = parse_filter_block(p);
    else if (!strcmp(name, "with")) r = parse_with(p);
    else if (!strcmp(name, "print")) {
        const int line = next_tok(p)->line;
        nvec v = {0};
        while (cur(p)->kind != JT_BLOCK_END) {
            if (v.n) expect(p, JT_COMMA);
            nv_push(p, &v, parse_expression(p, true));
        }
        r = mk(p, JN_OUTPUT, line);
        r->items = nv_done(v);
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        const int line = next_tok(p)->line;
        if (p->loop_depth == 0) {
            p->z->line = line;
            jz_fail(p->z, "SyntaxError", "'%s' outside loop", name);
        }
        r = mk(p, name[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
    } else if (!strcmp(name, "generation")) {
        /* Hugging Face's AssistantTracker tag: a call block whose caller renders the body, so
         * the body is a scope of its own (sets inside do not leak, break cannot reach out) */
        const int line = next_tok(p)->line;
        const int loops = p->loop_depth;
        p->loop_depth = 0;
        r = mk(p, JN_SCOPE, line);
        r->scope.body = parse_statements(p, END_GEN, true);
        p->loop_depth = loops;
    } else if (!strcmp(name, "block") || !strcmp(name, "extends") || !strcmp(name, "include") ||
               !strcmp(name, "import") || !strcmp(name, "from") || !strcmp(name, "autoescape")) {
        p->z->line = t->line;
        jz_unsupported(p->z, "the {%% %s %%} statement", name);
    } else {
        p->n_tags--;
        fail_ut_eof(p, name, t->line);
    }
    p->n_tags--;
    return r;
}

static jnodes subparse(parser *p, const char *const *end_tokens) {
    nvec body = {0};
    if (end_tokens) {
        if (p->n_ends == 256) {
            p->z->line = cur(p)->line;
            jz_unsupported(p->z, "blocks nested more than 256 deep");
        }
        p->end_stack[p->n_ends++] = end_tokens;
    }
    for (;;) {
        const jtok *t = cur(p);
        if (t->kind == JT_EOF) break;
        if (t->kind == JT_DATA) {
            jnode *d = mk(p, JN_DATA, t->line);
            d->text = t->s;
            nv_push(p, &body, d);
            next_tok(p);
        } else if (t->kind == JT_VAR_BEGIN) {
            next_tok(p);
            jnode *o = mk(p, JN_OUTPUT, t->line);
            nvec one = {0};
            nv_push(p, &one, parse_tuple(p, false, true, NULL, false, false));
            o->items = nv_done(one);
            nv_push(p, &body, o);
            expect(p, JT_VAR_END);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            next_tok(p);
            if (end_tokens && test_any(cur(p), end_tokens)) {
                p->n_ends--;
                return nv_done(body);
            }
            jnode *s = parse_statement(p);
            nv_push(p, &body, s);
            expect(p, JT_BLOCK_END);
        } else {
            pfail(p, t->line, "unexpected '%s'", jt_describe(t));
        }
    }
    if (end_tokens) p->n_ends--;
    return nv_done(body);
}

/* ---- jinja2's compile-time checks ------------------------------------------------------------- */

/* An unknown filter or test fails the whole template unless jinja2 compiles it in a soft frame:
 * the test and bodies of an if, and all of an inline if, but not inside a loop, macro or block
 * nested there (those open frames of their own). */
static void check(tr_jinja *p, const jnode *n, bool soft);

static void check_list(tr_jinja *p, const jnodes *v, bool soft) {
    for (size_t i = 0; i < v->n; i++) check(p, v->v[i], soft);
}

static void check_args(tr_jinja *p, const jargs *a, bool soft) {
    check_list(p, &a->pos, soft);
    for (size_t i = 0; i < a->nkw; i++) check(p, a->kw[i].value, soft);
    if (a->star) check(p, a->star, soft);
    if (a->dstar) check(p, a->dstar, soft);
}

static void check(tr_jinja *p, const jnode *n, bool soft) {
    if (!n) return;
    switch ((jn_kind)n->kind) {
    case JN_OUTPUT: case JN_LIST: case JN_TUPLE: case JN_CONCAT: check_list(p, &n->items, soft); break;
    case JN_DICT:
        for (size_t i = 0; i < n->dict.keys.n; i++) {
            check(p, n->dict.keys.v[i], soft);
            check(p, n->dict.vals.v[i], soft);
        }
        break;
    case JN_GETATTR: check(p, n->getattr.obj, soft); break;
    case JN_GETITEM: check(p, n->getitem.obj, soft); check(p, n->getitem.arg, soft); break;
    case JN_SLICE:
        check(p, n->slice.start, soft);
        check(p, n->slice.stop, soft);
        check(p, n->slice.step, soft);
        break;
    case JN_CALL: check(p, n->call.fn, soft); check_args(p, &n->call.args, soft); break;
    case JN_FILTER:
    case JN_TEST:
        if (n->filter.id < 0 && !soft) {
            char msg[300];
            snprintf(msg, sizeof msg, "No %s named '%s'.", n->kind == JN_FILTER ? "filter" : "test",
                     n->filter.name->p);
            late_fail_t(p, n->line, "TemplateAssertionError", msg);
        }
        check(p, n->filter.obj, soft);
        check_args(p, &n->filter.args, soft);
        break;
    case JN_NOT: case JN_NEG: case JN_POS: check(p, n->bin.a, soft); break;
    case JN_BINOP: case JN_AND: case JN_OR: check(p, n->bin.a, soft); check(p, n->bin.b, soft); break;
    case JN_COMPARE:
        check(p, n->cmp.first, soft);
        for (size_t i = 0; i < n->cmp.n; i++) check(p, n->cmp.rest[i], soft);
        break;
    case JN_CONDEXPR:
        check(p, n->cond.a, true);
        check(p, n->cond.cond, true);
        check(p, n->cond.b, true);
        break;
    case JN_IF:
        check(p, n->if_.test, true);
        check_list(p, &n->if_.body, true);
        check_list(p, &n->if_.else_, true);
        break;
    case JN_FOR:
        check(p, n->for_.iter, soft);
        check(p, n->for_.filter, false);
        check_list(p, &n->for_.body, false);
        check_list(p, &n->for_.else_, false);
        break;
    case JN_SET: check(p, n->set.value, soft); break;
    case JN_SETBLOCK: check_list(p, &n->setblock.body, false); check(p, n->setblock.filter, false); break;
    case JN_MACRO:
        for (size_t i = 0; i < n->macro.ndefaults; i++) check(p, n->macro.defaults[i], false);
        check_list(p, &n->macro.body, false);
        break;
    case JN_CALLBLOCK: check(p, n->callblock.call, soft); check(p, n->callblock.macro, false); break;
    case JN_FILTERBLOCK: check(p, n->filterblock.filter, false); check_list(p, &n->filterblock.body, false); break;
    case JN_WITH:
        for (size_t i = 0; i < n->with.n; i++) check(p, n->with.values[i], soft);
        check_list(p, &n->with.body, false);
        break;
    case JN_SCOPE: check_list(p, &n->scope.body, false); break;
    default: break;
    }
}

/* ---- jinja2's symbol analysis (idtracking) ------------------------------------------------------ */

/*
 * For each frame, in source order: a name first read there, with no frame around having it,
 * is resolved from the render variables; a name first assigned there is an alias of the
 * enclosing frame's when one has it, else it starts "missing". A name assigned in some but not
 * all branches of an if (jinja2 counts the body, the elifs together and the else) is loaded
 * from outside. Nested frames are analysed after their parent, seeing all of its names.
 * Only the "missing" names need anything at run time.
 */
enum { M_RESOLVE = 1, M_ALIAS, M_UNDEF, M_PARAM };

typedef struct symtab {
    int *sym;
    uint8_t *mode;
    size_t n, cap;
    int *stores;
    size_t nstores, cap_stores;
} symtab;

typedef struct anc {
    const symtab *t;
    const struct anc *up;
} anc;

typedef struct analysis {
    parser *p;
    symtab t;
    const anc *up;
    nvec children; /* statements that open frames, analysed once this one is complete */
} analysis;

static int st_find(const symtab *t, int sym) {
    for (size_t i = 0; i < t->n; i++)
        if (t->sym[i] == sym) return (int)i;
    return -1;
}

static bool st_stored(const symtab *t, int sym) {
    for (size_t i = 0; i < t->nstores; i++)
        if (t->stores[i] == sym) return true;
    return false;
}

static void st_define(parser *p, symtab *t, int sym, uint8_t mode) {
    const int i = st_find(t, sym);
    if (i >= 0) {
        t->mode[i] = mode;
        return;
    }
    if (t->n == t->cap) {
        const size_t cap = t->cap ? t->cap * 2 : 8;
        t->sym = jz_grow(p->z, t->sym, t->cap * sizeof *t->sym, cap * sizeof *t->sym);
        t->mode = jz_grow(p->z, t->mode, t->cap, cap);
        t->cap = cap;
    }
    t->sym[t->n] = sym;
    t->mode[t->n++] = mode;
}

static void st_add_store(parser *p, symtab *t, int sym) {
    if (st_stored(t, sym)) return;
    if (t->nstores == t->cap_stores) {
        const size_t cap = t->cap_stores ? t->cap_stores * 2 : 8;
        t->stores = jz_grow(p->z, t->stores, t->cap_stores * sizeof(int), cap * sizeof(int));
        t->cap_stores = cap;
    }
    t->stores[t->nstores++] = sym;
}

static symtab st_copy(parser *p, const symtab *t) {
    symtab c = {0};
    for (size_t i = 0; i < t->n; i++) st_define(p, &c, t->sym[i], t->mode[i]);
    for (size_t i = 0; i < t->nstores; i++) st_add_store(p, &c, t->stores[i]);
    return c;
}

static bool anc_has(const anc *a, int sym) {
    for (; a; a = a->up)
        if (st_find(a->t, sym) >= 0) return true;
    return false;
}

static void a_load(analysis *a, int sym) {
    if (st_find(&a->t, sym) < 0 && !anc_has(a->up, sym)) st_define(a->p, &a->t, sym, M_RESOLVE);
}

static void a_store(analysis *a, int sym) {
    st_add_store(a->p, &a->t, sym);
    if (st_find(&a->t, sym) >= 0) return;
    st_define(a->p, &a->t, sym, anc_has(a->up, sym) ? M_ALIAS : M_UNDEF);
}

static void a_param(analysis *a, int sym) {
    st_add_store(a->p, &a->t, sym);
    st_define(a->p, &a->t, sym, M_PARAM);
}

static void a_expr(analysis *a, const jnode *n);
static void a_stmts(analysis *a, const jnodes *v);

static void a_exprs(analysis *a, const jnodes *v) {
    for (size_t i = 0; i < v->n; i++) a_expr(a, v->v[i]);
}

static void a_args(analysis *a, const jargs *g) {
    a_exprs(a, &g->pos);
    for (size_t i = 0; i < g->nkw; i++) a_expr(a, g->kw[i].value);
    if (g->star) a_expr(a, g->star);
    if (g->dstar) a_expr(a, g->dstar);
}

static void a_expr(analysis *a, const jnode *n) {
    if (!n) return;
    switch ((jn_kind)n->kind) {
    case JN_NAME: a_load(a, n->name.sym); break;
    case JN_NSREF: a_load(a, n->nsref.sym); break;
    case JN_LIST: case JN_TUPLE: case JN_CONCAT: a_exprs(a, &n->items); break;
    case JN_DICT:
        for (size_t i = 0; i < n->dict.keys.n; i++) {
            a_expr(a, n->dict.keys.v[i]);
            a_expr(a, n->dict.vals.v[i]);
        }
        break;
    case JN_GETATTR: a_expr(a, n->getattr.obj); break;
    case JN_GETITEM: a_expr(a, n->getitem.obj); a_expr(a, n->getitem.arg); break;
    case JN_SLICE: a_expr(a, n->slice.start); a_expr(a, n->slice.stop); a_expr(a, n->slice.step); break;
    case JN_CALL: a_expr(a, n->call.fn); a_args(a, &n->call.args); break;
    case JN_FILTER: case JN_TEST: a_expr(a, n->filter.obj); a_args(a, &n->filter.args); break;
    case JN_NOT: case JN_NEG: case JN_POS: a_expr(a, n->bin.a); break;
    case JN_BINOP: case JN_AND: case JN_OR: a_expr(a, n->bin.a); a_expr(a, n->bin.b); break;
    case JN_COMPARE:
        a_expr(a, n->cmp.first);
        for (size_t i = 0; i < n->cmp.n; i++) a_expr(a, n->cmp.rest[i]);
        break;
    case JN_CONDEXPR: a_expr(a, n->cond.a); a_expr(a, n->cond.cond); a_expr(a, n->cond.b); break;
    default: break;
    }
}

static void a_target(analysis *a, const jnode *t, bool param) {
    if (t->kind == JN_NAME) {
        if (param) a_param(a, t->name.sym);
        else a_store(a, t->name.sym);
    } else if (t->kind == JN_NSREF) {
        a_load(a, t->nsref.sym);
    } else if (t->kind == JN_TUPLE) {
        for (size_t i = 0; i < t->items.n; i++) a_target(a, t->items.v[i], param);
    }
}

/* visits a branch on a copy of the symbols; returns the copy */
static symtab a_branch(analysis *a, const jnodes *stmts, const jnode *elif_chain) {
    const symtab saved = a->t;
    a->t = st_copy(a->p, &saved);
    if (stmts) a_stmts(a, stmts);
    for (const jnode *e = elif_chain; e; e = e->if_.else_.n == 1 && e->if_.else_.v[0]->is_elif ? e->if_.else_.v[0] : NULL) {
        /* an elif is an If of its own with only a body: its test, then its body as one of three
         * branches (so what it assigns counts as assigned in some branches only) */
        a_expr(a, e->if_.test);
        const symtab before = a->t;
        a->t = st_copy(a->p, &before);
        a_stmts(a, &e->if_.body);
        const symtab body = a->t;
        a->t = before;
        for (size_t i = 0; i < body.n; i++)
            if (st_find(&a->t, body.sym[i]) < 0) st_define(a->p, &a->t, body.sym[i], body.mode[i]);
        for (size_t i = 0; i < body.nstores; i++) {
            const int sym = body.stores[i];
            if (st_stored(&a->t, sym)) continue;
            st_add_store(a->p, &a->t, sym);
            st_define(a->p, &a->t, sym, anc_has(a->up, sym) ? M_ALIAS : M_RESOLVE);
        }
    }
    const symtab got = a->t;
    a->t = saved;
    return got;
}

static void a_if(analysis *a, const jnode *n) {
    a_expr(a, n->if_.test);
    /* jinja2's branches: the body, the elifs, the else */
    const jnode *elif = n->if_.else_.n == 1 && n->if_.else_.v[0]->is_elif ? n->if_.else_.v[0] : NULL;
    const jnode *last = n;
    for (const jnode *e = elif; e; e = e->if_.else_.n == 1 && e->if_.else_.v[0]->is_elif ? e->if_.else_.v[0] : NULL) last = e;
    const jnodes *else_ = last->if_.else_.n == 1 && last->if_.else_.v[0]->is_elif ? NULL : &last->if_.else_;
    symtab br[3];
    br[0] = a_branch(a, &n->if_.body, NULL);
    br[1] = a_branch(a, NULL, elif);
    br[2] = a_branch(a, else_, NULL);
    /* branch_update */
    int counted[256];
    int counts[256];
    size_t nc = 0;
    for (int b = 0; b < 3; b++)
        for (size_t i = 0; i < br[b].nstores; i++) {
            const int sym = br[b].stores[i];
            if (st_stored(&a->t, sym)) continue;
            size_t k = 0;
            while (k < nc && counted[k] != sym) k++;
            if (k == nc) {
                if (nc == 256) {
                    a->p->z->line = n->line;
                    jz_unsupported(a->p->z, "more than 256 names assigned in one if");
                }
                counted[nc] = sym;
                counts[nc++] = 0;
            }
            counts[k]++;
        }
    for (int b = 0; b < 3; b++) {
        for (size_t i = 0; i < br[b].n; i++) st_define(a->p, &a->t, br[b].sym[i], br[b].mode[i]);
        for (size_t i = 0; i < br[b].nstores; i++) st_add_store(a->p, &a->t, br[b].stores[i]);
    }
    for (size_t k = 0; k < nc; k++)
        if (counts[k] != 3) st_define(a->p, &a->t, counted[k], anc_has(a->up, counted[k]) ? M_ALIAS : M_RESOLVE);
}

static void a_stmt(analysis *a, const jnode *n) {
    switch ((jn_kind)n->kind) {
    case JN_OUTPUT: a_exprs(a, &n->items); break;
    case JN_IF: a_if(a, n); break;
    case JN_FOR: a_expr(a, n->for_.iter); nv_push(a->p, &a->children, (jnode *)n); break;
    case JN_SET: a_expr(a, n->set.value); a_target(a, n->set.target, false); break;
    case JN_SETBLOCK: a_target(a, n->setblock.target, false); nv_push(a->p, &a->children, (jnode *)n); break;
    case JN_MACRO: a_store(a, n->macro.sym); nv_push(a->p, &a->children, (jnode *)n); break;
    case JN_CALLBLOCK: a_expr(a, n->callblock.call); nv_push(a->p, &a->children, (jnode *)n); break;
    case JN_FILTERBLOCK:
        for (const jnode *f = n->filterblock.filter; f; f = f->filter.obj) a_args(a, &f->filter.args);
        nv_push(a->p, &a->children, (jnode *)n);
        break;
    case JN_WITH:
        for (size_t i = 0; i < n->with.n; i++) a_expr(a, n->with.values[i]);
        nv_push(a->p, &a->children, (jnode *)n);
        break;
    case JN_SCOPE: nv_push(a->p, &a->children, (jnode *)n); break;
    default: break;
    }
}

static void a_stmts(analysis *a, const jnodes *v) {
    for (size_t i = 0; i < v->n; i++) a_stmt(a, v->v[i]);
}

static void analyse_frame(parser *p, const anc *up, jscope *out, const jnode *owner, int part);

/* the frame's missing names, then its nested frames */
static void finish_frame(analysis *a, jscope *out) {
    size_t n = 0;
    for (size_t i = 0; i < a->t.n; i++) n += a->t.mode[i] == M_UNDEF;
    out->missing = jz_alloc(a->p->z, (n + 1) * sizeof(int));
    out->n = 0;
    for (size_t i = 0; i < a->t.n; i++)
        if (a->t.mode[i] == M_UNDEF) out->missing[out->n++] = a->t.sym[i];
    const anc me = {&a->t, a->up};
    for (size_t i = 0; i < a->children.n; i++) {
        jnode *c = a->children.v[i];
        analyse_frame(a->p, &me, &c->sc, c, 0);
        if (c->kind == JN_FOR) analyse_frame(a->p, &me, &c->sc_else, c, 1);
    }
}

static void a_macro_frame(analysis *a, const jnode *m) {
    for (size_t i = 0; i < m->macro.nparams; i++) a_param(a, m->macro.params[i]);
    for (size_t i = 0; i < m->macro.ndefaults; i++) a_expr(a, m->macro.defaults[i]);
    a_stmts(a, &m->macro.body);
}

/* part: 0 = the statement's main frame, 1 = a for loop's else */
static void analyse_frame(parser *p, const anc *up, jscope *out, const jnode *n, int part) {
    analysis a = {.p = p, .up = up};
    switch ((jn_kind)n->kind) {
    case JN_FOR:
        if (part == 1) {
            a_stmts(&a, &n->for_.else_);
        } else {
            a_target(&a, n->for_.target, true);
            a_stmts(&a, &n->for_.body);
        }
        break;
    case JN_MACRO: a_macro_frame(&a, n); break;
    case JN_CALLBLOCK: a_macro_frame(&a, n->callblock.macro); break;
    case JN_SETBLOCK: a_stmts(&a, &n->setblock.body); break;
    case JN_FILTERBLOCK:
        for (const jnode *f = n->filterblock.filter; f; f = f->filter.obj) a_args(&a, &f->filter.args);
        a_stmts(&a, &n->filterblock.body);
        break;
    case JN_WITH:
        for (size_t i = 0; i < n->with.n; i++) a_target(&a, n->with.targets[i], true);
        a_stmts(&a, &n->with.body);
        break;
    case JN_SCOPE: a_stmts(&a, &n->scope.body); break;
    default: break;
    }
    finish_frame(&a, out);
}

void jparse(tr_jinja *t, const jtok *toks, size_t ntoks) {
    parser P = {.t = t, .z = &t->z, .tok = toks, .n = ntoks};
    check_error(&P, &toks[0]);
    t->body = subparse(&P, NULL);
    /* jinja2 analyses each frame's names before the optimizer folds its expressions */
    analysis root = {.p = &P};
    a_stmts(&root, &t->body);
    finish_frame(&root, &t->sc);
}

void jcheck(tr_jinja *t) {
    check_list(t, &t->body, false);
    if (t->has_late) {
        t->z.line = t->late_line;
        jz_fail(&t->z, t->late_kind, "%s", t->late_msg);
    }
}
