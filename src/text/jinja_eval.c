/*
 * The template interpreter: walks the AST with jinja2's scoping and Python's operators.
 *
 * Scopes follow the code jinja2 generates: the template body is one frame; every loop iteration,
 * macro call, {% with %}, {% filter %}, {% set %}...{% endset %} and call-block body gets a new
 * frame whose reads fall through to the enclosing one (so a {% set %} inside a loop is gone in the
 * next iteration and after the loop; namespace() attributes are how templates carry state out).
 * A macro's frame falls through to the frame it was defined in, as it is when the macro runs
 * (Python closures). Names found in no frame are the render variables, then the globals.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

enum { X_NORMAL = 0, X_BREAK, X_CONTINUE };

static int exec_body(jrender *r, jframe *f, const jnodes *body, jbuf *out);
static jv eval(jrender *r, jframe *f, const jnode *n);

jv jr_eval(jrender *r, jframe *f, const jnode *n) { return eval(r, f, n); }

static void step(jrender *r, const jnode *n) {
    r->z.line = n->line;
    if (++r->z.steps > r->z.step_limit)
        jz_fail(&r->z, "ResourceLimit", "the template ran more than %" PRIu64 " evaluation steps",
                r->z.step_limit);
}

/* ---- frames ----------------------------------------------------------------------------------- */

/* what a "missing" name holds in its frame (see jscope) */
static jundef k_missing;

static void frame_set(jrender *r, jframe *f, int sym, jv v);

static void frame_enter(jrender *r, jframe *f, const jscope *sc) {
    for (size_t i = 0; sc && i < sc->n; i++) frame_set(r, f, sc->missing[i], (jv){.k = JV_UNDEF, .u = &k_missing});
}

static jframe *frame_new(jrender *r, jframe *parent, const jscope *sc) {
    jframe *f = jz_alloc(&r->z, sizeof *f);
    f->parent = parent;
    frame_enter(r, f, sc);
    return f;
}

static void frame_set(jrender *r, jframe *f, int sym, jv v) {
    for (size_t i = 0; i < f->n; i++) {
        if (f->syms[i] == sym) {
            f->vals[i] = v;
            return;
        }
    }
    if (f->n == f->cap) {
        const size_t cap = f->cap ? f->cap * 2 : 4;
        f->syms = jz_grow(&r->z, f->syms, f->cap * sizeof *f->syms, cap * sizeof *f->syms);
        f->vals = jz_grow(&r->z, f->vals, f->cap * sizeof *f->vals, cap * sizeof *f->vals);
        f->cap = cap;
    }
    f->syms[f->n] = sym;
    f->vals[f->n] = v;
    f->n++;
}

static jv lookup(jrender *r, const jframe *f, int sym) {
    for (; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (f->syms[i] == sym) {
                if (f->vals[i].k == JV_UNDEF && f->vals[i].u == &k_missing)
                    return jv_undef_named(&r->z, r->t->syms[sym].name->p);
                return f->vals[i];
            }
    if (r->root_ok[sym]) return r->root[sym];
    return jv_undef_named(&r->z, r->t->syms[sym].name->p);
}

/* ---- calls ------------------------------------------------------------------------------------ */

static jv call_macro(jrender *r, const jmacro *m, jlist *args, jdict *kw);
static jv call_loop(jrender *r, jloop *loop, jlist *args, jdict *kw);

jv jr_call(jrender *r, jv fn, jlist *args, jdict *kw) {
    switch ((jv_kind)fn.k) {
    case JV_UNDEF: jv_fail_undefined(&r->z, fn);
    case JV_MACRO: return call_macro(r, fn.m, args, kw);
    case JV_FUNC: return jb_call(r, fn.fn, args, kw);
    case JV_LOOP: return call_loop(r, fn.loop, args, kw);
    case JV_JOINER:
        if (args->n || kw->n) jz_fail(&r->z, "TypeError", "Joiner.__call__() takes 1 positional argument but %zu were given", args->n + 1);
        if (!fn.o->used) {
            fn.o->used = true;
            return jv_of_str(&js_empty);
        }
        return jv_of_str(fn.o->sep);
    default: jz_fail(&r->z, "TypeError", "'%s' object is not callable", jv_type_name(fn));
    }
}

static void eval_args(jrender *r, jframe *f, const jargs *a, jlist **pos, jdict **kw) {
    jz *z = &r->z;
    *pos = jl_new(z, a->pos.n);
    *kw = jd_new(z, a->nkw);
    for (size_t i = 0; i < a->pos.n; i++) jl_push(z, *pos, eval(r, f, a->pos.v[i]));
    for (size_t i = 0; i < a->nkw; i++) jd_set(z, *kw, jv_of_str(a->kw[i].name), eval(r, f, a->kw[i].value));
    if (a->star) {
        const jv s = eval(r, f, a->star);
        const jlist *l = jv_iter_list(z, s);
        for (size_t i = 0; i < l->n; i++) jl_push(z, *pos, l->v[i]);
    }
    if (a->dstar) {
        const jv d = eval(r, f, a->dstar);
        if (d.k != JV_DICT) jz_fail(z, "TypeError", "argument after ** must be a mapping, not %s", jv_type_name(d));
        for (size_t i = 0; i < d.d->n; i++) {
            if (d.d->keys[i].k != JV_STR) jz_fail(z, "TypeError", "keywords must be strings");
            jd_set(z, *kw, d.d->keys[i], d.d->vals[i]);
        }
    }
}

static jv kw_pop(jrender *r, jdict *kw, jstr *name, bool *found) {
    for (size_t i = 0; i < kw->n; i++) {
        if (kw->keys[i].k == JV_STR && js_eq(kw->keys[i].s, name)) {
            const jv v = kw->vals[i];
            memmove(kw->keys + i, kw->keys + i + 1, (kw->n - i - 1) * sizeof(jv));
            memmove(kw->vals + i, kw->vals + i + 1, (kw->n - i - 1) * sizeof(jv));
            kw->n--;
            *found = true;
            return v;
        }
    }
    (void)r;
    *found = false;
    return JV_UNDEF_V;
}

static jv call_macro(jrender *r, const jmacro *m, jlist *args, jdict *kw) {
    jz *z = &r->z;
    const jnode *mn = m->node;
    const size_t np = mn->macro.nparams;
    const char *mname = mn->macro.name->p;
    if (++z->depth > 100) jz_fail(z, "RecursionError", "maximum recursion depth exceeded (macro calls nested more than 100 deep)");
    jframe *f = frame_new(r, m->closure, &m->scope_node->sc);
    jv *vals = jz_alloc(z, (np + 1) * sizeof(jv));
    bool *given = jz_alloc(z, np + 1);
    size_t npos = args->n < np ? args->n : np;
    for (size_t i = 0; i < npos; i++) {
        vals[i] = args->v[i];
        given[i] = true;
    }
    bool found_caller = false, explicit_caller = false;
    int caller_sym = -1;
    for (size_t i = 0; i < r->t->nsyms; i++)
        if (js_eqc(r->t->syms[i].name, "caller")) caller_sym = (int)i;
    for (size_t i = 0; i < np; i++) explicit_caller |= mn->macro.params[i] == caller_sym;
    if (npos != np) {
        for (size_t i = npos; i < np; i++) {
            bool found;
            const jv v = kw_pop(r, kw, r->t->syms[mn->macro.params[i]].name, &found);
            if (found) vals[i] = v, given[i] = true;
            if (mn->macro.params[i] == caller_sym) found_caller = true;
        }
    } else {
        found_caller = explicit_caller;
    }
    jv caller = JV_UNDEF_V;
    const bool wants_caller = mn->macro.uses_caller && !found_caller;
    if (wants_caller) {
        bool found;
        caller = kw_pop(r, kw, js_cstr(z, "caller"), &found);
        if (!found || caller.k == JV_NONE) caller = jv_undef_hint(z, "No caller defined");
    }
    if (mn->macro.uses_kwargs) {
        /* kwargs: what is left */
    } else if (kw->n) {
        if (jd_getc(kw, "caller", NULL))
            jz_fail(z, "TypeError", "macro '%s' was invoked with two values for the special caller argument. This is most likely a bug.", mname);
        jbuf b = {0};
        jv_write_repr(z, &b, kw->keys[0]);
        jz_fail(z, "TypeError", "macro '%s' takes no keyword argument %s", mname, b.p);
    }
    if (!mn->macro.uses_varargs && args->n > np)
        jz_fail(z, "TypeError", "macro '%s' takes not more than %zu argument(s)", mname, np);
    /* bind in order; defaults are evaluated in the macro's frame at call time */
    const size_t first_default = np - mn->macro.ndefaults;
    for (size_t i = 0; i < np; i++) {
        jv v = vals[i];
        if (!given[i]) {
            if (i >= first_default) {
                v = eval(r, f, mn->macro.defaults[i - first_default]);
            } else {
                jbuf b = {0};
                jb_printf(z, &b, "parameter '%s' was not provided", r->t->syms[mn->macro.params[i]].name->p);
                v = jv_undef_hint(z, b.p);
            }
        }
        frame_set(r, f, mn->macro.params[i], v);
    }
    for (size_t i = 0; i < r->t->nsyms; i++) {
        const jstr *s = r->t->syms[i].name;
        if (mn->macro.uses_varargs && js_eqc(s, "varargs")) {
            jlist *rest = jl_new(z, 0);
            for (size_t k = np; k < args->n; k++) jl_push(z, rest, args->v[k]);
            frame_set(r, f, (int)i, jv_of_tuple(rest));
        }
        if (mn->macro.uses_kwargs && js_eqc(s, "kwargs")) frame_set(r, f, (int)i, jv_of_dict(kw));
        if (wants_caller && js_eqc(s, "caller")) frame_set(r, f, (int)i, caller);
    }
    jbuf out = {0};
    jb_put(z, &out, "", 0);
    exec_body(r, f, &mn->macro.body, &out);
    z->depth--;
    return jv_str(z, out.p, out.len);
}

/* ---- expressions ------------------------------------------------------------------------------ */

static bool compare(jrender *r, jop op, jv a, jv b) {
    switch (op) {
    case JOP_EQ: return jv_eq(&r->z, a, b);
    case JOP_NE: return !jv_eq(&r->z, a, b);
    case JOP_LT: return jv_lt(&r->z, a, b, "<");
    case JOP_LE: return jv_lt(&r->z, a, b, "<=");
    case JOP_GT: return jv_lt(&r->z, a, b, ">");
    case JOP_GE: return jv_lt(&r->z, a, b, ">=");
    case JOP_IN: return jb_in(r, a, b);
    case JOP_NOTIN: return !jb_in(r, a, b);
    default: return false;
    }
}

static jv apply_filters(jrender *r, jframe *f, const jnode *n, jv innermost) {
    /* a filter chain whose innermost object is `innermost` (filter blocks, set blocks) */
    jv v = n->filter.obj ? apply_filters(r, f, n->filter.obj, innermost) : innermost;
    jlist *pos;
    jdict *kw;
    eval_args(r, f, &n->filter.args, &pos, &kw);
    r->z.line = n->line;
    if (n->filter.id < 0) jz_fail(&r->z, "TemplateRuntimeError", "No filter named '%s' found.", n->filter.name->p);
    return jb_filter(r, n->filter.id, n->filter.name->p, v, pos, kw);
}

/* folding: what jinja2's as_const cannot evaluate */
static _Noreturn void impossible(jrender *r) { jz_fail(&r->z, "Impossible", "not a constant"); }

static jv eval(jrender *r, jframe *f, const jnode *n) {
    jz *z = &r->z;
    step(r, n);
    if (r->folding) {
        if (n->kind == JN_NAME || n->kind == JN_NSREF || n->kind == JN_CALL) impossible(r);
        if ((n->kind == JN_FILTER || n->kind == JN_TEST) && !jr_filter_foldable(n)) impossible(r);
    }
    switch ((jn_kind)n->kind) {
    case JN_CONST: return n->value;
    case JN_NAME: return lookup(r, f, n->name.sym);
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l = jl_new(z, n->items.n);
        for (size_t i = 0; i < n->items.n; i++) l->v[l->n++] = eval(r, f, n->items.v[i]);
        return n->kind == JN_LIST ? jv_of_list(l) : jv_of_tuple(l);
    }
    case JN_DICT: {
        jdict *d = jd_new(z, n->dict.keys.n);
        for (size_t i = 0; i < n->dict.keys.n; i++) {
            const jv k = eval(r, f, n->dict.keys.v[i]);
            const jv v = eval(r, f, n->dict.vals.v[i]);
            r->z.line = n->line;
            jd_set(z, d, k, v);
        }
        return jv_of_dict(d);
    }
    case JN_GETATTR: {
        const jv obj = eval(r, f, n->getattr.obj);
        r->z.line = n->line;
        return jr_getattr(r, obj, n->getattr.attr);
    }
    case JN_GETITEM: {
        const jv obj = eval(r, f, n->getitem.obj);
        const jnode *a = n->getitem.arg;
        if (a->kind == JN_SLICE) {
            const jv st = a->slice.start ? eval(r, f, a->slice.start) : JV_NONE_V;
            const jv sp = a->slice.stop ? eval(r, f, a->slice.stop) : JV_NONE_V;
            const jv sc = a->slice.step ? eval(r, f, a->slice.step) : JV_NONE_V;
            r->z.line = n->line;
            return jr_slice(r, obj, st, sp, sc);
        }
        const jv key = eval(r, f, a);
        r->z.line = n->line;
        return jr_getitem(r, obj, key);
    }
    case JN_SLICE: jz_fail(z, "TemplateSyntaxError", "a slice outside a subscript");
    case JN_CALL: {
        const jv fn = eval(r, f, n->call.fn);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &n->call.args, &pos, &kw);
        r->z.line = n->line;
        return jr_call(r, fn, pos, kw);
    }
    case JN_FILTER: {
        const jv v = eval(r, f, n->filter.obj);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &n->filter.args, &pos, &kw);
        r->z.line = n->line;
        /* jinja2 calls a stub that raises, once the arguments are evaluated */
        if (n->filter.id < 0) jz_fail(z, "TemplateRuntimeError", "No filter named '%s' found.", n->filter.name->p);
        return jb_filter(r, n->filter.id, n->filter.name->p, v, pos, kw);
    }
    case JN_TEST: {
        const jv v = eval(r, f, n->filter.obj);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &n->filter.args, &pos, &kw);
        r->z.line = n->line;
        if (n->filter.id < 0) jz_fail(z, "TemplateRuntimeError", "No test named '%s' found.", n->filter.name->p);
        return jv_bool(jb_test(r, n->filter.id, n->filter.name->p, v, pos, kw));
    }
    case JN_NOT: return jv_bool(!jv_truthy(z, eval(r, f, n->bin.a)));
    case JN_NEG:
    case JN_POS: {
        const jv v = eval(r, f, n->bin.a);
        r->z.line = n->line;
        return jr_unary(r, n->kind == JN_NEG, v);
    }
    case JN_BINOP: {
        const jv a = eval(r, f, n->bin.a);
        const jv b = eval(r, f, n->bin.b);
        r->z.line = n->line;
        return jr_binop(r, (jop)n->op, a, b);
    }
    case JN_CONCAT: {
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        for (size_t i = 0; i < n->items.n; i++) jv_write_str(z, &b, eval(r, f, n->items.v[i]));
        return jv_str(z, b.p, b.len);
    }
    case JN_AND: {
        const jv a = eval(r, f, n->bin.a);
        return jv_truthy(z, a) ? eval(r, f, n->bin.b) : a;
    }
    case JN_OR: {
        const jv a = eval(r, f, n->bin.a);
        return jv_truthy(z, a) ? a : eval(r, f, n->bin.b);
    }
    case JN_COMPARE: {
        jv left = eval(r, f, n->cmp.first);
        for (size_t i = 0; i < n->cmp.n; i++) {
            const jv right = eval(r, f, n->cmp.rest[i]);
            r->z.line = n->line;
            if (!compare(r, n->cmp.ops[i], left, right)) return jv_bool(false);
            left = right;
        }
        return jv_bool(true);
    }
    case JN_CONDEXPR:
        if (jv_truthy(z, eval(r, f, n->cond.cond))) return eval(r, f, n->cond.a);
        if (n->cond.b) return eval(r, f, n->cond.b);
        if (r->folding) impossible(r);
        {
            jbuf b = {0};
            jb_printf(z, &b, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
            return jv_undef_hint(z, b.p);
        }
    default: break;
    }
    jz_fail(z, "RuntimeError", "not an expression (node %d)", n->kind);
}

/* ---- assignment ------------------------------------------------------------------------------- */

static void assign(jrender *r, jframe *f, const jnode *target, jv v) {
    jz *z = &r->z;
    if (target->kind == JN_NAME) {
        frame_set(r, f, target->name.sym, v);
        return;
    }
    if (target->kind == JN_NSREF) {
        const jv ns = lookup(r, f, target->nsref.sym);
        if (ns.k != JV_NS) jz_fail(z, "TemplateRuntimeError", "cannot assign attribute on non-namespace object");
        jd_set(z, ns.d, jv_of_str(target->nsref.attr), v);
        return;
    }
    /* tuple unpacking */
    if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
    if (v.k != JV_STR && !jv_is_seq(v) && v.k != JV_DICT && v.k != JV_GEN)
        jz_fail(z, "TypeError", "cannot unpack non-iterable %s object", jv_type_name(v));
    const jlist *l = jv_iter_list(z, v);
    const size_t want = target->items.n;
    if (l->n < want) jz_fail(z, "ValueError", "not enough values to unpack (expected %zu, got %zu)", want, l->n);
    if (l->n > want) jz_fail(z, "ValueError", "too many values to unpack (expected %zu)", want);
    for (size_t i = 0; i < want; i++) assign(r, f, target->items.v[i], l->v[i]);
}

/* ---- statements ------------------------------------------------------------------------------- */

/* a fresh scope for the next loop iteration: the last one's storage unless a macro kept it */
static jframe *iteration_frame(jrender *r, jframe *f, jframe *last, const jscope *sc) {
    if (!last || last->captured) return frame_new(r, f, sc);
    last->n = 0;
    frame_enter(r, last, sc);
    return last;
}

/* one more item from the loop's source through its `if`; false at the end */
static bool loop_pull(jrender *r, jloop *l) {
    jz *z = &r->z;
    const jnode *n = l->node;
    while (!l->src_done) {
        jv x;
        if (l->src.k == JV_GEN) {
            if (!jg_next(z, l->src.g, &x)) break;
        } else {
            if (l->src_pos >= l->src_list->n) break;
            x = l->src_list->v[l->src_pos++];
        }
        if (n->for_.filter) {
            step(r, n);
            l->test_frame = iteration_frame(r, l->frame, l->test_frame, NULL);
            assign(r, l->test_frame, n->for_.target, x);
            if (!jv_truthy(z, eval(r, l->test_frame, n->for_.filter))) continue;
        }
        jl_push(z, l->items, x);
        return true;
    }
    l->src_done = true;
    return false;
}

bool jr_loop_have(jrender *r, jloop *l, size_t k) {
    while (l->items->n <= k)
        if (!loop_pull(r, l)) return false;
    return true;
}

static int exec_for(jrender *r, jframe *f, const jnode *n, jv iterable, int depth0, jbuf *out) {
    jz *z = &r->z;
    int loop_sym = -1;
    for (size_t i = 0; i < r->t->nsyms; i++)
        if (js_eqc(r->t->syms[i].name, "loop")) loop_sym = (int)i;
    jloop *loop = jz_alloc(z, sizeof *loop);
    loop->depth0 = depth0;
    loop->node = n;
    loop->frame = f;
    loop->src = iterable;
    if (iterable.k == JV_GEN) {
        loop->items = jl_new(z, 0);
    } else {
        loop->src_list = jv_iter_list(z, iterable);
        if (n->for_.filter) {
            loop->items = jl_new(z, 0);
        } else {
            loop->items = (jlist *)loop->src_list;
            loop->src_done = true;
        }
    }
    jframe *it = NULL;
    /* jinja2 marks an iteration at the end of its body, so the else runs unless some iteration
     * got there (one ended by break or continue does not count) */
    bool completed = false;
    for (size_t i = 0; jr_loop_have(r, loop, i); i++) {
        step(r, n); /* an empty body must not make a loop free */
        loop->index0 = i;
        it = iteration_frame(r, f, it, &n->sc);
        r->z.line = n->line;
        assign(r, it, n->for_.target, loop->items->v[i]);
        if (loop_sym >= 0) frame_set(r, it, loop_sym, (jv){.k = JV_LOOP, .loop = loop});
        const int x = exec_body(r, it, &n->for_.body, out);
        if (x == X_NORMAL) completed = true;
        if (x == X_BREAK) break;
    }
    if (!completed && n->for_.else_.n) exec_body(r, frame_new(r, f, &n->sc_else), &n->for_.else_, out);
    return X_NORMAL;
}

static jv call_loop(jrender *r, jloop *loop, jlist *args, jdict *kw) {
    jz *z = &r->z;
    if (!loop->node->for_.recursive)
        jz_fail(z, "TypeError", "The loop must have the 'recursive' marker to be called recursively.");
    if (args->n != 1 || kw->n) jz_fail(z, "TypeError", "loop() takes exactly one argument");
    if (++z->depth > 100) jz_fail(z, "RecursionError", "maximum recursion depth exceeded (recursive loop calls)");
    jbuf out = {0};
    jb_put(z, &out, "", 0);
    exec_for(r, loop->frame, loop->node, args->v[0], loop->depth0 + 1, &out);
    z->depth--;
    return jv_str(z, out.p, out.len);
}

static int exec(jrender *r, jframe *f, const jnode *n, jbuf *out) {
    jz *z = &r->z;
    step(r, n);
    switch ((jn_kind)n->kind) {
    case JN_DATA: jb_put(z, out, n->text->p, n->text->len); return X_NORMAL;
    case JN_OUTPUT:
        for (size_t i = 0; i < n->items.n; i++) {
            const jv v = eval(r, f, n->items.v[i]);
            r->z.line = n->line;
            jv_write_str(z, out, v);
        }
        return X_NORMAL;
    case JN_IF:
        if (jv_truthy(z, eval(r, f, n->if_.test))) return exec_body(r, f, &n->if_.body, out);
        return exec_body(r, f, &n->if_.else_, out);
    case JN_FOR: return exec_for(r, f, n, eval(r, f, n->for_.iter), 0, out);
    case JN_SET: {
        const jv v = eval(r, f, n->set.value);
        r->z.line = n->line;
        assign(r, f, n->set.target, v);
        return X_NORMAL;
    }
    case JN_SETBLOCK: {
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        exec_body(r, frame_new(r, f, &n->sc), &n->setblock.body, &b);
        jv v = jv_str(z, b.p, b.len);
        if (n->setblock.filter) v = apply_filters(r, f, n->setblock.filter, v);
        r->z.line = n->line;
        assign(r, f, n->setblock.target, v);
        return X_NORMAL;
    }
    case JN_MACRO: {
        jmacro *m = jz_alloc(z, sizeof *m);
        m->node = n;
        m->scope_node = n;
        m->closure = f;
        for (jframe *g = f; g; g = g->parent) g->captured = true;
        frame_set(r, f, n->macro.sym, (jv){.k = JV_MACRO, .m = m});
        return X_NORMAL;
    }
    case JN_CALLBLOCK: {
        jmacro *caller = jz_alloc(z, sizeof *caller);
        caller->node = n->callblock.macro;
        caller->scope_node = n;
        caller->closure = f;
        for (jframe *g = f; g; g = g->parent) g->captured = true;
        const jnode *call = n->callblock.call;
        const jv fn = eval(r, f, call->call.fn);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &call->call.args, &pos, &kw);
        jd_set(z, kw, jv_cstr(z, "caller"), (jv){.k = JV_MACRO, .m = caller});
        r->z.line = n->line;
        jv_write_str(z, out, jr_call(r, fn, pos, kw));
        return X_NORMAL;
    }
    case JN_FILTERBLOCK: {
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        jframe *inner = frame_new(r, f, &n->sc);
        exec_body(r, inner, &n->filterblock.body, &b);
        const jv v = apply_filters(r, inner, n->filterblock.filter, jv_str(z, b.p, b.len));
        jv_write_str(z, out, v);
        return X_NORMAL;
    }
    case JN_WITH: {
        jframe *inner = frame_new(r, f, &n->sc);
        for (size_t i = 0; i < n->with.n; i++) {
            const jv v = eval(r, f, n->with.values[i]);
            assign(r, inner, n->with.targets[i], v);
        }
        return exec_body(r, inner, &n->with.body, out);
    }
    case JN_BREAK: return X_BREAK;
    case JN_CONTINUE: return X_CONTINUE;
    case JN_SCOPE: exec_body(r, frame_new(r, f, &n->sc), &n->scope.body, out); return X_NORMAL;
    case JN_UNSUPPORTED_STMT: jz_unsupported(z, "%s", n->unsupported.what->p);
    default: break;
    }
    jz_fail(z, "RuntimeError", "not a statement (node %d)", n->kind);
}

static int exec_body(jrender *r, jframe *f, const jnodes *body, jbuf *out) {
    for (size_t i = 0; i < body->n; i++) {
        const int x = exec(r, f, body->v[i], out);
        if (x != X_NORMAL) return x;
    }
    return X_NORMAL;
}

/* ---- entry points ----------------------------------------------------------------------------- */

static void to_error(const jz *z, tr_error *err, const char *where) {
    if (!err) return;
    err->status = z->status;
    if (z->status == TR_E_NOMEM || z->status == TR_E_ARG || z->err_line <= 0)
        snprintf(err->msg, sizeof err->msg, "%s (%s, %s)", z->msg, z->kind, where);
    else
        snprintf(err->msg, sizeof err->msg, "%s (%s, template line %d)", z->msg, z->kind, z->err_line);
}

tr_status tr_jinja_parse(const char *src, size_t len, tr_jinja **out, tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_jinja_parse: out is NULL");
    *out = NULL;
    if (!src) return tr_fail(err, TR_E_ARG, "tr_jinja_parse: no template text");
    if (!ju_valid(src, len)) return tr_fail(err, TR_E_FORMAT, "the template is not valid UTF-8");
    tr_jinja *t = calloc(1, sizeof *t);
    if (!t) return tr_fail(err, TR_E_NOMEM, "out of memory parsing a template");
    jz_init(&t->z, (size_t)64 << 20);
    if (setjmp(t->z.jb)) {
        to_error(&t->z, err, "parsing the template");
        const tr_status st = t->z.status;
        jz_free(&t->z);
        free(t);
        return st;
    }
    jtok *toks;
    size_t ntoks;
    jlex(&t->z, src, len, &toks, &ntoks);
    jparse(t, toks, ntoks);
    jfold(t);
    jcheck(t);
    *out = t;
    return TR_OK;
}

void tr_jinja_free(tr_jinja *t) {
    if (!t) return;
    jz_free(&t->z);
    free(t);
}

static tr_status render(jrender *r, const tr_jinja_var *vars, size_t n_vars, char **out, size_t *out_len) {
    jz *z = &r->z;
    const tr_jinja *t = r->t;
    r->vars = jd_new(z, n_vars);
    for (size_t i = 0; i < n_vars; i++) {
        const tr_jinja_var *v = &vars[i];
        if (v->kind == TR_JINJA_JSON_VARS) {
            if (!v->text) continue;
            const jv obj = jv_from_json(z, v->text, strlen(v->text), v->name ? v->name : "variables");
            if (obj.k != JV_DICT)
                jz_fail_st(z, TR_E_ARG, "ValueError", "%s: a JSON object is needed, not %s",
                           v->name ? v->name : "variables", jv_type_name(obj));
            for (size_t k = 0; k < obj.d->n; k++) jd_set(z, r->vars, obj.d->keys[k], obj.d->vals[k]);
            continue;
        }
        if (!v->name) jz_fail_st(z, TR_E_ARG, "ValueError", "variable %zu has no name", i);
        jv val = JV_NONE_V;
        switch (v->kind) {
        case TR_JINJA_JSON:
            if (!v->text) jz_fail_st(z, TR_E_ARG, "ValueError", "variable '%s' has no JSON text", v->name);
            val = jv_from_json(z, v->text, strlen(v->text), v->name);
            break;
        case TR_JINJA_STRING:
            if (!v->text) jz_fail_st(z, TR_E_ARG, "ValueError", "variable '%s' has no text", v->name);
            if (!ju_valid(v->text, strlen(v->text)))
                jz_fail_st(z, TR_E_ARG, "ValueError", "variable '%s' is not valid UTF-8", v->name);
            val = jv_cstr(z, v->text);
            break;
        case TR_JINJA_BOOL: val = jv_bool(v->b); break;
        case TR_JINJA_NONE: break;
        case TR_JINJA_JSON_VARS: break;
        }
        jd_set(z, r->vars, jv_cstr(z, v->name), val);
    }
    r->root = jz_alloc(z, (t->nsyms + 1) * sizeof(jv));
    r->root_ok = jz_alloc(z, t->nsyms + 1);
    for (size_t i = 0; i < t->nsyms; i++) {
        if (jd_getc(r->vars, t->syms[i].name->p, &r->root[i])) r->root_ok[i] = true;
        else if (t->syms[i].global >= 0) {
            r->root[i] = jb_global(r, t->syms[i].global);
            r->root_ok[i] = true;
        }
    }
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    exec_body(r, frame_new(r, NULL, &t->sc), &t->body, &b);
    char *res = malloc(b.len + 1);
    if (!res) jz_oom(z);
    memcpy(res, b.p, b.len + 1);
    *out = res;
    if (out_len) *out_len = b.len;
    return TR_OK;
}

tr_status tr_jinja_render(const tr_jinja *t, const tr_jinja_var *vars, size_t n_vars,
                          const tr_jinja_opts *opts, char **out, size_t *out_len, tr_error *err) {
    if (!t || !out) return tr_fail(err, TR_E_ARG, "tr_jinja_render: no template or no output");
    if (n_vars && !vars) return tr_fail(err, TR_E_ARG, "tr_jinja_render: %zu variables at NULL", n_vars);
    *out = NULL;
    jrender *r = calloc(1, sizeof *r);
    if (!r) return tr_fail(err, TR_E_NOMEM, "out of memory rendering a template");
    jz_init(&r->z, opts && opts->max_bytes ? opts->max_bytes : (size_t)256 << 20);
    r->z.step_limit = opts && opts->max_steps ? opts->max_steps : 50000000;
    r->t = t;
    if (opts && opts->has_now) {
        r->has_now = true;
        r->now = opts->now;
    }
    tr_status st;
    if (setjmp(r->z.jb)) {
        to_error(&r->z, err, "rendering the template");
        st = r->z.status;
    } else {
        st = render(r, vars, n_vars, out, out_len);
    }
    jz_free(&r->z);
    free(r);
    return st;
}

