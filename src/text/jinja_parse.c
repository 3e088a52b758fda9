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



/* the lexer's error, raised when the parser reaches it (jinja2 tokenizes as it parses) */
void jp_check_error(const parser *p, const jtok *t) {
    if (t->kind != JT_ERROR) return;
    p->z->line = t->line;
    jz_fail(p->z, t->err_kind, "%s", t->s->p);
}

const jtok *jp_cur(const parser *p) { return &p->tok[p->i]; }
static const jtok *look(const parser *p) {
    const jtok *t = &p->tok[p->i + 1 < p->n ? p->i + 1 : p->i];
    jp_check_error(p, t);
    return t;
}
const jtok *jp_next_tok(parser *p) {
    const jtok *t = &p->tok[p->i];
    if (p->i + 1 < p->n) p->i++;
    jp_check_error(p, &p->tok[p->i]);
    return t;
}

_Noreturn void jp_pfail(parser *p, int line, const char *fmt, ...) TR_PRINTF(3, 4);
_Noreturn void jp_pfail(parser *p, int line, const char *fmt, ...) {
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->z->line = line;
    jz_fail(p->z, "TemplateSyntaxError", "%s", msg);
}

void jlate_fail(tr_jinja *t, int line, const char *kind, const char *msg) {
    if (t->has_late) return;
    t->has_late = true;
    t->late_line = line;
    snprintf(t->late_kind, sizeof t->late_kind, "%s", kind);
    snprintf(t->late_msg, sizeof t->late_msg, "%s", msg);
}

void jp_late_fail(parser *p, int line, const char *kind, const char *msg) { jlate_fail(p->t, line, kind, msg); }

void jn_push(jz *z, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        const size_t cap = v->cap ? v->cap * 2 : 4;
        v->v = jz_grow(z, v->v, v->cap * sizeof *v->v, cap * sizeof *v->v);
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

bool jp_is_name(const jtok *t, const char *v) { return t->kind == JT_NAME && js_eqc(t->s, v); }

/* a token expression "name:endfor" or a token kind, as jinja2's describe_token_expr */
const char *jp_describe_expr(const char *e) {
    if (!strncmp(e, "name:", 5)) return e + 5;
    return e;
}

static const char *kind_desc(jt_kind k) {
    if (k == JT_NAME) return "name";
    jtok t = {.kind = (uint8_t)k};
    return jt_describe(&t);
}

const jtok *jp_expect(parser *p, jt_kind k) {
    const jtok *t = jp_cur(p);
    if (t->kind != k) {
        if (t->kind == JT_EOF)
            jp_pfail(p, t->line, "unexpected end of template, expected '%s'.", kind_desc(k));
        jp_pfail(p, t->line, "expected token '%s', got '%s'", kind_desc(k), jt_describe(t));
    }
    return jp_next_tok(p);
}

void jp_expect_name(parser *p, const char *v) {
    const jtok *t = jp_cur(p);
    if (!jp_is_name(t, v)) {
        if (t->kind == JT_EOF) jp_pfail(p, t->line, "unexpected end of template, expected '%s'.", v);
        jp_pfail(p, t->line, "expected token '%s', got '%s'", v, jt_describe(t));
    }
    jp_next_tok(p);
}

bool jp_skip_if(parser *p, jt_kind k) {
    if (jp_cur(p)->kind != k) return false;
    jp_next_tok(p);
    return true;
}

bool jp_skip_name(parser *p, const char *v) {
    if (!jp_is_name(jp_cur(p), v)) return false;
    jp_next_tok(p);
    return true;
}

/* ---- nodes ------------------------------------------------------------------------------------ */

jnode *jp_mk(parser *p, jn_kind k, int line) {
    jnode *n = jz_alloc(p->z, sizeof *n);
    n->kind = (uint8_t)k;
    n->line = line;
    return n;
}

void jp_nv_push(parser *p, nvec *v, jnode *x) { jn_push(p->z, v, x); }

jnodes jp_nv_done(nvec v) { return (jnodes){v.v, v.n}; }

int jp_sym_of(parser *p, const jstr *name) {
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

jnode *jp_parse_expression(parser *p, bool with_condexpr);
jnode *jp_parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                          bool explicit_parens, bool with_namespace);
static jnode *parse_unary(parser *p, bool with_filter);
jnode *jp_parse_primary(parser *p, bool with_namespace);
static jnode *parse_postfix(parser *p, jnode *node);
static jnode *parse_filter_expr(parser *p, jnode *node);
jnode *jp_parse_filter(parser *p, jnode *node, bool start_inline);

static void enter_expr(parser *p) {
    if (++p->expr_depth > 150) {
        p->z->line = jp_cur(p)->line;
        jz_unsupported(p->z, "expressions nested more than 150 deep");
    }
}

static jnode *parse_condexpr(parser *p);

static jnode *parse_or(parser *p);

jnode *jp_parse_expression(parser *p, bool with_condexpr) {
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static jnode *parse_condexpr(parser *p) {
    enter_expr(p);
    int line = jp_cur(p)->line;
    jnode *e1 = parse_or(p);
    while (jp_skip_name(p, "if")) {
        jnode *e2 = parse_or(p);
        jnode *e3 = NULL;
        if (jp_skip_name(p, "else")) e3 = parse_condexpr(p);
        jnode *c = jp_mk(p, JN_CONDEXPR, line);
        c->cond.cond = e2;
        c->cond.a = e1;
        c->cond.b = e3;
        e1 = c;
        line = jp_cur(p)->line;
    }
    p->expr_depth--;
    return e1;
}

static jnode *bin(parser *p, jn_kind k, jnode *a, jnode *b, int line) {
    jnode *n = jp_mk(p, k, line);
    n->bin.a = a;
    n->bin.b = b;
    return n;
}

static jnode *parse_not(parser *p);

static jnode *parse_and(parser *p) {
    int line = jp_cur(p)->line;
    jnode *left = parse_not(p);
    while (jp_skip_name(p, "and")) {
        left = bin(p, JN_AND, left, parse_not(p), line);
        line = jp_cur(p)->line;
    }
    return left;
}

static jnode *parse_or(parser *p) {
    int line = jp_cur(p)->line;
    jnode *left = parse_and(p);
    while (jp_skip_name(p, "or")) {
        left = bin(p, JN_OR, left, parse_and(p), line);
        line = jp_cur(p)->line;
    }
    return left;
}

static jnode *parse_compare(parser *p);

static jnode *parse_not(parser *p) {
    if (jp_is_name(jp_cur(p), "not")) {
        const int line = jp_next_tok(p)->line;
        enter_expr(p);
        jnode *n = jp_mk(p, JN_NOT, line);
        n->bin.a = parse_not(p);
        p->expr_depth--;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_math1(parser *p);

static jnode *parse_compare(parser *p) {
    int line = jp_cur(p)->line;
    jnode *expr = parse_math1(p);
    jop ops[64];
    jnode *rest[64];
    size_t n = 0;
    for (;;) {
        const jtok *t = jp_cur(p);
        jop op;
        if (t->kind == JT_EQ) op = JOP_EQ;
        else if (t->kind == JT_NE) op = JOP_NE;
        else if (t->kind == JT_LT) op = JOP_LT;
        else if (t->kind == JT_LTEQ) op = JOP_LE;
        else if (t->kind == JT_GT) op = JOP_GT;
        else if (t->kind == JT_GTEQ) op = JOP_GE;
        else if (jp_is_name(t, "in")) op = JOP_IN;
        else if (jp_is_name(t, "not") && jp_is_name(look(p), "in")) op = JOP_NOTIN;
        else break;
        jp_next_tok(p);
        if (op == JOP_NOTIN) jp_next_tok(p);
        if (n == 64) {
            p->z->line = t->line;
            jz_unsupported(p->z, "more than 64 chained comparisons");
        }
        ops[n] = op;
        rest[n++] = parse_math1(p);
        line = jp_cur(p)->line;
    }
    if (!n) return expr;
    jnode *c = jp_mk(p, JN_COMPARE, line);
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
    int line = jp_cur(p)->line;
    jnode *left = parse_concat(p);
    while (jp_cur(p)->kind == JT_ADD || jp_cur(p)->kind == JT_SUB) {
        const jop op = jp_next_tok(p)->kind == JT_ADD ? JOP_ADD : JOP_SUB;
        left = binop(p, op, left, parse_concat(p), line);
        line = jp_cur(p)->line;
    }
    return left;
}

static jnode *parse_math2(parser *p);

static jnode *parse_concat(parser *p) {
    const int line = jp_cur(p)->line;
    jnode *first = parse_math2(p);
    if (jp_cur(p)->kind != JT_TILDE) return first;
    nvec v = {0};
    jp_nv_push(p, &v, first);
    while (jp_skip_if(p, JT_TILDE)) jp_nv_push(p, &v, parse_math2(p));
    jnode *n = jp_mk(p, JN_CONCAT, line);
    n->items = jp_nv_done(v);
    return n;
}

static jnode *parse_pow(parser *p);

static jnode *parse_math2(parser *p) {
    int line = jp_cur(p)->line;
    jnode *left = parse_pow(p);
    for (;;) {
        const jt_kind k = (jt_kind)jp_cur(p)->kind;
        jop op;
        if (k == JT_MUL) op = JOP_MUL;
        else if (k == JT_DIV) op = JOP_DIV;
        else if (k == JT_FLOORDIV) op = JOP_FLOORDIV;
        else if (k == JT_MOD) op = JOP_MOD;
        else break;
        jp_next_tok(p);
        left = binop(p, op, left, parse_pow(p), line);
        line = jp_cur(p)->line;
    }
    return left;
}

static jnode *parse_pow(parser *p) {
    int line = jp_cur(p)->line;
    jnode *left = parse_unary(p, true);
    while (jp_skip_if(p, JT_POW)) {
        left = binop(p, JOP_POW, left, parse_unary(p, true), line);
        line = jp_cur(p)->line;
    }
    return left;
}

static jnode *parse_unary(parser *p, bool with_filter) {
    enter_expr(p);
    const jtok *t = jp_cur(p);
    jnode *node;
    if (t->kind == JT_SUB || t->kind == JT_ADD) {
        jp_next_tok(p);
        node = jp_mk(p, t->kind == JT_SUB ? JN_NEG : JN_POS, t->line);
        node->bin.a = parse_unary(p, false);
    } else {
        node = jp_parse_primary(p, false);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    p->expr_depth--;
    return node;
}

static jnode *parse_list(parser *p) {
    const int line = jp_expect(p, JT_LBRACKET)->line;
    nvec v = {0};
    while (jp_cur(p)->kind != JT_RBRACKET) {
        if (v.n) jp_expect(p, JT_COMMA);
        if (jp_cur(p)->kind == JT_RBRACKET) break;
        jp_nv_push(p, &v, jp_parse_expression(p, true));
    }
    jp_expect(p, JT_RBRACKET);
    jnode *n = jp_mk(p, JN_LIST, line);
    n->items = jp_nv_done(v);
    return n;
}

static jnode *parse_dict(parser *p) {
    const int line = jp_expect(p, JT_LBRACE)->line;
    nvec k = {0}, v = {0};
    while (jp_cur(p)->kind != JT_RBRACE) {
        if (k.n) jp_expect(p, JT_COMMA);
        if (jp_cur(p)->kind == JT_RBRACE) break;
        jp_nv_push(p, &k, jp_parse_expression(p, true));
        jp_expect(p, JT_COLON);
        jp_nv_push(p, &v, jp_parse_expression(p, true));
    }
    jp_expect(p, JT_RBRACE);
    jnode *n = jp_mk(p, JN_DICT, line);
    n->dict.keys = jp_nv_done(k);
    n->dict.vals = jp_nv_done(v);
    return n;
}

jnode *jp_parse_primary(parser *p, bool with_namespace) {
    const jtok *t = jp_cur(p);
    jnode *node;
    if (t->kind == JT_NAME) {
        jp_next_tok(p);
        if (js_eqc(t->s, "true") || js_eqc(t->s, "True") || js_eqc(t->s, "false") || js_eqc(t->s, "False")) {
            node = jp_mk(p, JN_CONST, t->line);
            node->value = jv_bool(t->s->p[0] == 't' || t->s->p[0] == 'T');
        } else if (js_eqc(t->s, "none") || js_eqc(t->s, "None")) {
            node = jp_mk(p, JN_CONST, t->line);
            node->value = JV_NONE_V;
        } else if (with_namespace && jp_cur(p)->kind == JT_DOT) {
            jp_next_tok(p);
            const jtok *attr = jp_expect(p, JT_NAME);
            node = jp_mk(p, JN_NSREF, t->line);
            node->nsref.sym = jp_sym_of(p, t->s);
            node->nsref.attr = attr->s;
        } else {
            node = jp_mk(p, JN_NAME, t->line);
            node->name.sym = jp_sym_of(p, t->s);
        }
    } else if (t->kind == JT_STRING) {
        jp_next_tok(p);
        jstr *s = t->s;
        if (jp_cur(p)->kind == JT_STRING) {
            jbuf b = {0};
            jb_put(p->z, &b, s->p, s->len);
            while (jp_cur(p)->kind == JT_STRING) {
                const jtok *u = jp_next_tok(p);
                jb_put(p->z, &b, u->s->p, u->s->len);
            }
            s = js_new(p->z, b.p, b.len);
        }
        node = jp_mk(p, JN_CONST, t->line);
        node->value = jv_of_str(s);
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        jp_next_tok(p);
        node = jp_mk(p, JN_CONST, t->line);
        node->value = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
    } else if (t->kind == JT_LPAREN) {
        jp_next_tok(p);
        node = jp_parse_tuple(p, false, true, NULL, true, false);
        jp_expect(p, JT_RPAREN);
    } else if (t->kind == JT_LBRACKET) {
        node = parse_list(p);
    } else if (t->kind == JT_LBRACE) {
        node = parse_dict(p);
    } else {
        jp_pfail(p, t->line, "unexpected '%s'", jt_describe(t));
    }
    return node;
}

static bool is_tuple_end(parser *p, const char *extra) {
    const jtok *t = jp_cur(p);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || t->kind == JT_RPAREN) return true;
    return extra && jp_is_name(t, extra);
}

jnode *jp_parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                          bool explicit_parens, bool with_namespace) {
    int line = jp_cur(p)->line;
    nvec v = {0};
    bool is_tuple = false;
    for (;;) {
        if (v.n) jp_expect(p, JT_COMMA);
        if (is_tuple_end(p, extra_end)) break;
        jp_nv_push(p, &v, simplified ? jp_parse_primary(p, with_namespace) : jp_parse_expression(p, with_condexpr));
        if (jp_cur(p)->kind == JT_COMMA) is_tuple = true;
        else break;
        line = jp_cur(p)->line;
    }
    if (!is_tuple) {
        if (v.n) return v.v[0];
        if (!explicit_parens)
            jp_pfail(p, jp_cur(p)->line, "Expected an expression, got '%s'", jt_describe(jp_cur(p)));
    }
    jnode *n = jp_mk(p, JN_TUPLE, line);
    n->items = jp_nv_done(v);
    return n;
}

static jnode *parse_subscribed(parser *p) {
    const int line = jp_cur(p)->line;
    jnode *args[3] = {NULL, NULL, NULL};
    if (jp_cur(p)->kind == JT_COLON) {
        jp_next_tok(p);
    } else {
        jnode *node = jp_parse_expression(p, true);
        if (jp_cur(p)->kind != JT_COLON) return node;
        jp_next_tok(p);
        args[0] = node;
    }
    if (jp_cur(p)->kind != JT_COLON && jp_cur(p)->kind != JT_RBRACKET && jp_cur(p)->kind != JT_COMMA)
        args[1] = jp_parse_expression(p, true);
    if (jp_cur(p)->kind == JT_COLON) {
        jp_next_tok(p);
        if (jp_cur(p)->kind != JT_RBRACKET && jp_cur(p)->kind != JT_COMMA) args[2] = jp_parse_expression(p, true);
    }
    jnode *n = jp_mk(p, JN_SLICE, line);
    n->slice.start = args[0];
    n->slice.stop = args[1];
    n->slice.step = args[2];
    return n;
}

static jnode *parse_subscript(parser *p, jnode *node) {
    const jtok *t = jp_next_tok(p);
    if (t->kind == JT_DOT) {
        const jtok *a = jp_next_tok(p);
        if (a->kind == JT_NAME) {
            jnode *n = jp_mk(p, JN_GETATTR, t->line);
            n->getattr.obj = node;
            n->getattr.attr = a->s;
            return n;
        }
        if (a->kind != JT_INT) jp_pfail(p, a->line, "expected name or number");
        jnode *c = jp_mk(p, JN_CONST, a->line);
        c->value = jv_int(a->i);
        jnode *n = jp_mk(p, JN_GETITEM, t->line);
        n->getitem.obj = node;
        n->getitem.arg = c;
        return n;
    }
    /* [ */
    nvec v = {0};
    while (jp_cur(p)->kind != JT_RBRACKET) {
        if (v.n) jp_expect(p, JT_COMMA);
        jp_nv_push(p, &v, parse_subscribed(p));
    }
    jp_expect(p, JT_RBRACKET);
    jnode *arg;
    if (v.n == 1) {
        arg = v.v[0];
    } else {
        arg = jp_mk(p, JN_TUPLE, t->line);
        arg->items = jp_nv_done(v);
    }
    jnode *n = jp_mk(p, JN_GETITEM, t->line);
    n->getitem.obj = node;
    n->getitem.arg = arg;
    return n;
}

static jargs parse_call_args(parser *p) {
    const jtok *lp = jp_expect(p, JT_LPAREN);
    nvec pos = {0};
    jkwarg kw[64];
    size_t nkw = 0;
    jargs a = {0};
    bool require_comma = false;
    while (jp_cur(p)->kind != JT_RPAREN) {
        if (require_comma) {
            jp_expect(p, JT_COMMA);
            if (jp_cur(p)->kind == JT_RPAREN) break;
        }
        if (jp_cur(p)->kind == JT_MUL) {
            if (a.star || a.dstar) jp_pfail(p, lp->line, "invalid syntax for function call expression");
            jp_next_tok(p);
            a.star = jp_parse_expression(p, true);
        } else if (jp_cur(p)->kind == JT_POW) {
            if (a.dstar) jp_pfail(p, lp->line, "invalid syntax for function call expression");
            jp_next_tok(p);
            a.dstar = jp_parse_expression(p, true);
        } else if (jp_cur(p)->kind == JT_NAME && look(p)->kind == JT_ASSIGN) {
            if (a.dstar) jp_pfail(p, lp->line, "invalid syntax for function call expression");
            jstr *key = jp_cur(p)->s;
            jp_next_tok(p);
            jp_next_tok(p);
            if (nkw == 64) {
                p->z->line = lp->line;
                jz_unsupported(p->z, "more than 64 keyword arguments");
            }
            kw[nkw].name = key;
            kw[nkw++].value = jp_parse_expression(p, true);
        } else {
            if (a.star || a.dstar || nkw) jp_pfail(p, lp->line, "invalid syntax for function call expression");
            jp_nv_push(p, &pos, jp_parse_expression(p, true));
        }
        require_comma = true;
    }
    jp_expect(p, JT_RPAREN);
    a.pos = jp_nv_done(pos);
    a.nkw = nkw;
    if (nkw) {
        a.kw = jz_alloc(p->z, nkw * sizeof *kw);
        memcpy(a.kw, kw, nkw * sizeof *kw);
    }
    return a;
}

static jnode *parse_call(parser *p, jnode *node) {
    const int line = jp_cur(p)->line;
    jnode *n = jp_mk(p, JN_CALL, line);
    n->call.fn = node;
    n->call.args = parse_call_args(p);
    return n;
}

static jnode *parse_postfix(parser *p, jnode *node) {
    for (;;) {
        const jt_kind k = (jt_kind)jp_cur(p)->kind;
        if (k == JT_DOT || k == JT_LBRACKET) node = parse_subscript(p, node);
        else if (k == JT_LPAREN) node = parse_call(p, node);
        else return node;
    }
}

static jstr *dotted_name(parser *p) {
    const jtok *t = jp_expect(p, JT_NAME);
    if (jp_cur(p)->kind != JT_DOT) return t->s;
    jbuf b = {0};
    jb_put(p->z, &b, t->s->p, t->s->len);
    while (jp_skip_if(p, JT_DOT)) {
        jb_putc(p->z, &b, '.');
        const jtok *u = jp_expect(p, JT_NAME);
        jb_put(p->z, &b, u->s->p, u->s->len);
    }
    return js_new(p->z, b.p, b.len);
}

jnode *jp_parse_filter(parser *p, jnode *node, bool start_inline) {
    while (jp_cur(p)->kind == JT_PIPE || start_inline) {
        if (!start_inline) jp_next_tok(p);
        const int line = jp_cur(p)->line;
        jstr *name = dotted_name(p);
        jnode *f = jp_mk(p, JN_FILTER, line);
        f->filter.obj = node;
        f->filter.name = name;
        f->filter.id = jb_filter_id(name->p);
        if (jp_cur(p)->kind == JT_LPAREN) f->filter.args = parse_call_args(p);
        node = f;
        start_inline = false;
    }
    return node;
}

static jnode *parse_test(parser *p, jnode *node) {
    const jtok *is = jp_next_tok(p);
    const bool negated = jp_skip_name(p, "not");
    jstr *name = dotted_name(p);
    jnode *t = jp_mk(p, JN_TEST, is->line);
    t->filter.obj = node;
    t->filter.name = name;
    t->filter.id = jb_test_id(name->p);
    const jtok *c = jp_cur(p);
    if (c->kind == JT_LPAREN) {
        t->filter.args = parse_call_args(p);
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                c->kind == JT_LPAREN || c->kind == JT_LBRACKET || c->kind == JT_LBRACE) &&
               !jp_is_name(c, "else") && !jp_is_name(c, "or") && !jp_is_name(c, "and")) {
        if (jp_is_name(c, "is")) jp_pfail(p, c->line, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(p, jp_parse_primary(p, false));
        nvec v = {0};
        jp_nv_push(p, &v, arg);
        t->filter.args.pos = jp_nv_done(v);
    }
    if (negated) {
        jnode *n = jp_mk(p, JN_NOT, is->line);
        n->bin.a = t;
        return n;
    }
    return t;
}

static jnode *parse_filter_expr(parser *p, jnode *node) {
    for (;;) {
        const jtok *t = jp_cur(p);
        if (t->kind == JT_PIPE) node = jp_parse_filter(p, node, false);
        else if (jp_is_name(t, "is")) node = parse_test(p, node);
        else if (t->kind == JT_LPAREN) node = parse_call(p, node);
        else return node;
    }
}

