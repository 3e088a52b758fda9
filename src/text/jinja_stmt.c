/*
 * The template parser's statements: {% for %} {% if %} {% set %} {% macro %} {% call %}
 * {% filter %} {% with %} {% print %}, loopcontrols' break/continue, Hugging Face's
 * {% generation %}, and the template body; jinja2's messages for an unknown tag or a block left
 * open.
 */
#include <stdio.h>
#include <string.h>

#include "text/jinja_internal.h"

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
                                  jp_describe_expr(top[k]));
        bool expected = false;
        for (int s = 0; s < p->n_ends && name; s++)
            for (int k = 0; p->end_stack[s][k]; k++)
                if (!strcmp(jp_describe_expr(p->end_stack[s][k]), name)) expected = true;
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
    jp_pfail(p, line, "%s", msg);
}

static bool test_any(const jtok *t, const char *const *ends) {
    for (int k = 0; ends[k]; k++)
        if (jp_is_name(t, jp_describe_expr(ends[k]))) return true;
    return false;
}

static jnodes parse_statements(parser *p, const char *const *end_tokens, bool drop_needle) {
    jp_skip_if(p, JT_COLON);
    jp_expect(p, JT_BLOCK_END);
    jnodes body = subparse(p, end_tokens);
    if (jp_cur(p)->kind == JT_EOF) {
        /* fail_eof(end_tokens): the stack plus these */
        if (p->n_ends < 256) p->end_stack[p->n_ends++] = end_tokens;
        fail_ut_eof(p, NULL, jp_cur(p)->line);
    }
    if (drop_needle) jp_next_tok(p);
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
        const jtok *t = jp_expect(p, JT_NAME);
        target = jp_mk(p, JN_NAME, t->line);
        target->name.sym = jp_sym_of(p, t->s);
    } else if (with_tuple) {
        target = jp_parse_tuple(p, true, true, extra_end, false, with_namespace);
    } else {
        target = jp_parse_primary(p, with_namespace);
    }
    if (!can_assign(target))
        jp_pfail(p, target->line, "can't assign to '%s'", node_type_name(target));
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
    const int line = jp_next_tok(p)->line;
    jnode *n = jp_mk(p, JN_FOR, line);
    n->for_.target = parse_assign_target(p, true, false, "in", false);
    jp_expect_name(p, "in");
    n->for_.iter = jp_parse_tuple(p, false, false, "recursive", false, false);
    if (jp_skip_name(p, "if")) n->for_.filter = jp_parse_expression(p, true);
    n->for_.recursive = jp_skip_name(p, "recursive");
    p->loop_depth++;
    n->for_.body = parse_statements(p, END_FOR, false);
    p->loop_depth--;
    if (js_eqc(jp_next_tok(p)->s, "else")) n->for_.else_ = parse_statements(p, END_FOR2, true);
    if (target_has_loop(p, n->for_.target))
        jp_late_fail(p, line, "TemplateAssertionError", "Can't assign to special loop variable in for-loop target");
    return n;
}

static jnode *parse_if(parser *p) {
    const int line = jp_next_tok(p)->line;
    jnode *root = jp_mk(p, JN_IF, line), *node = root;
    for (;;) {
        node->if_.test = jp_parse_tuple(p, false, false, NULL, false, false);
        node->if_.body = parse_statements(p, END_IF, false);
        const jtok *t = jp_next_tok(p);
        if (jp_is_name(t, "elif")) {
            jnode *e = jp_mk(p, JN_IF, jp_cur(p)->line);
            e->is_elif = true;
            jnode **one = jz_alloc(p->z, sizeof *one);
            one[0] = e;
            node->if_.else_ = (jnodes){one, 1};
            node = e;
            continue;
        }
        if (jp_is_name(t, "else")) node->if_.else_ = parse_statements(p, END_IF2, true);
        break;
    }
    return root;
}

static jnode *parse_set(parser *p) {
    const int line = jp_next_tok(p)->line;
    jnode *target = parse_assign_target(p, true, false, NULL, true);
    if (jp_skip_if(p, JT_ASSIGN)) {
        jnode *n = jp_mk(p, JN_SET, line);
        n->set.target = target;
        n->set.value = jp_parse_tuple(p, false, true, NULL, false, false);
        return n;
    }
    jnode *n = jp_mk(p, JN_SETBLOCK, line);
    n->setblock.target = target;
    n->setblock.filter = jp_parse_filter(p, NULL, false);
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
    jp_expect(p, JT_LPAREN);
    while (jp_cur(p)->kind != JT_RPAREN) {
        if (np) jp_expect(p, JT_COMMA);
        const jtok *t = jp_expect(p, JT_NAME);
        if (np == 64) {
            p->z->line = t->line;
            jz_unsupported(p->z, "macros with more than 64 parameters");
        }
        const int sym = jp_sym_of(p, t->s);
        if (jp_skip_if(p, JT_ASSIGN)) defaults[nd++] = jp_parse_expression(p, true);
        else if (nd) jp_pfail(p, jp_cur(p)->line, "non-default argument follows default argument");
        params[np++] = sym;
    }
    jp_expect(p, JT_RPAREN);
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
    const int line = jp_next_tok(p)->line;
    jnode *m = jp_mk(p, JN_MACRO, line);
    const jtok *name = jp_expect(p, JT_NAME);
    m->macro.name = name->s;
    m->macro.sym = jp_sym_of(p, name->s);
    const int loops = p->loop_depth;
    p->loop_depth = 0;
    parse_signature(p, m);
    m->macro.body = parse_statements(p, END_MACRO, true);
    p->loop_depth = loops;
    macro_flags(p, m);
    return m;
}

static jnode *parse_call_block(parser *p) {
    const int line = jp_next_tok(p)->line;
    jnode *n = jp_mk(p, JN_CALLBLOCK, line);
    jnode *m = jp_mk(p, JN_MACRO, line);
    m->macro.name = js_cstr(p->z, "caller");
    m->macro.sym = -1;
    if (jp_cur(p)->kind == JT_LPAREN) parse_signature(p, m);
    else {
        m->macro.params = jz_alloc(p->z, sizeof(int));
        m->macro.defaults = jz_alloc(p->z, sizeof(jnode *));
    }
    jnode *call = jp_parse_expression(p, true);
    if (call->kind != JN_CALL) jp_pfail(p, line, "expected call");
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
    const int line = jp_next_tok(p)->line;
    jnode *n = jp_mk(p, JN_FILTERBLOCK, line);
    n->filterblock.filter = jp_parse_filter(p, NULL, true);
    n->filterblock.body = parse_statements(p, END_FILTER, true);
    return n;
}

static jnode *parse_with(parser *p) {
    const int line = jp_next_tok(p)->line;
    jnode *n = jp_mk(p, JN_WITH, line);
    nvec targets = {0}, values = {0};
    while (jp_cur(p)->kind != JT_BLOCK_END) {
        if (targets.n) jp_expect(p, JT_COMMA);
        jp_nv_push(p, &targets, parse_assign_target(p, true, false, NULL, false));
        jp_expect(p, JT_ASSIGN);
        jp_nv_push(p, &values, jp_parse_expression(p, true));
    }
    n->with.targets = targets.v;
    n->with.values = values.v;
    n->with.n = targets.n;
    n->with.body = parse_statements(p, END_WITH, true);
    return n;
}

static jnode *parse_statement(parser *p) {
    const jtok *t = jp_cur(p);
    if (t->kind != JT_NAME) jp_pfail(p, t->line, "tag name expected");
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
        const int line = jp_next_tok(p)->line;
        nvec v = {0};
        while (jp_cur(p)->kind != JT_BLOCK_END) {
            if (v.n) jp_expect(p, JT_COMMA);
            jp_nv_push(p, &v, jp_parse_expression(p, true));
        }
        r = jp_mk(p, JN_OUTPUT, line);
        r->items = jp_nv_done(v);
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        const int line = jp_next_tok(p)->line;
        if (p->loop_depth == 0) {
            p->z->line = line;
            jz_fail(p->z, "SyntaxError", "'%s' outside loop", name);
        }
        r = jp_mk(p, name[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
    } else if (!strcmp(name, "generation")) {
        /* Hugging Face's AssistantTracker tag: a call block whose caller renders the body, so
         * the body is a scope of its own (sets inside do not leak, break cannot reach out) */
        const int line = jp_next_tok(p)->line;
        const int loops = p->loop_depth;
        p->loop_depth = 0;
        r = jp_mk(p, JN_SCOPE, line);
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
            p->z->line = jp_cur(p)->line;
            jz_unsupported(p->z, "blocks nested more than 256 deep");
        }
        p->end_stack[p->n_ends++] = end_tokens;
    }
    for (;;) {
        const jtok *t = jp_cur(p);
        if (t->kind == JT_EOF) break;
        if (t->kind == JT_DATA) {
            jnode *d = jp_mk(p, JN_DATA, t->line);
            d->text = t->s;
            jp_nv_push(p, &body, d);
            jp_next_tok(p);
        } else if (t->kind == JT_VAR_BEGIN) {
            jp_next_tok(p);
            jnode *o = jp_mk(p, JN_OUTPUT, t->line);
            nvec one = {0};
            jp_nv_push(p, &one, jp_parse_tuple(p, false, true, NULL, false, false));
            o->items = jp_nv_done(one);
            jp_nv_push(p, &body, o);
            jp_expect(p, JT_VAR_END);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            jp_next_tok(p);
            if (end_tokens && test_any(jp_cur(p), end_tokens)) {
                p->n_ends--;
                return jp_nv_done(body);
            }
            jnode *s = parse_statement(p);
            jp_nv_push(p, &body, s);
            jp_expect(p, JT_BLOCK_END);
        } else {
            jp_pfail(p, t->line, "unexpected '%s'", jt_describe(t));
        }
    }
    if (end_tokens) p->n_ends--;
    return jp_nv_done(body);
}

void jparse(tr_jinja *t, const jtok *toks, size_t ntoks) {
    parser P = {.t = t, .z = &t->z, .tok = toks, .n = ntoks};
    jp_check_error(&P, &toks[0]);
    t->body = subparse(&P, NULL);
    /* jinja2 analyses each frame's names before the optimizer folds its expressions */
    jscope_analyse(t);
}

