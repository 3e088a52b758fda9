/*
 * jinja2's constant folding, for the few places where it changes what a template does.
 */
#include <stdlib.h>

#include "text/jinja_internal.h"

/* ---- constant folding ------------------------------------------------------------------------- */

/*
 * jinja2 folds expressions made of constants at compile time and keeps the result when its
 * repr is safe (None, bools, numbers, strings, and lists, tuples, dicts of those); a printed
 * expression is folded whatever its value, as str() of it. The difference this makes is the
 * folding's subscript: it goes through the sandbox's getitem, so a slice of a number folds to an
 * Undefined (printing as '') where the same slice at run time raises TypeError.
 */
bool jr_filter_foldable(const jnode *n) {
    static const char *const context_filters[] = {"map", "select", "reject", "selectattr", "rejectattr", "random", NULL};
    if (n->filter.id < 0 || !n->filter.obj || n->filter.args.star || n->filter.args.dstar) return false;
    if (n->kind == JN_FILTER)
        for (const char *const *c = context_filters; *c; c++)
            if (js_eqc(n->filter.name, *c)) return false;
    return true;
}

/* the expressions jinja2's as_const knows (names, calls and context filters fail inside) */
static bool foldable(const jnode *n) {
    switch ((jn_kind)n->kind) {
    case JN_LIST: case JN_TUPLE: case JN_CONCAT: case JN_DICT: case JN_GETATTR: case JN_GETITEM:
    case JN_FILTER: case JN_TEST: case JN_NOT: case JN_NEG: case JN_POS: case JN_BINOP: case JN_AND:
    case JN_OR: case JN_COMPARE: case JN_CONDEXPR:
        return true;
    default: return false;
    }
}

/* a cheap test first: no constant subtree without short circuits has names or calls */
static bool maybe_const(const jnode *n) {
    if (!n) return true;
    switch ((jn_kind)n->kind) {
    case JN_CONST: return true;
    case JN_NAME: case JN_NSREF: case JN_CALL: return false;
    case JN_AND: case JN_OR: return maybe_const(n->bin.a);
    case JN_CONDEXPR: return maybe_const(n->cond.cond);
    case JN_LIST: case JN_TUPLE: case JN_CONCAT:
        for (size_t i = 0; i < n->items.n; i++)
            if (!maybe_const(n->items.v[i])) return false;
        return true;
    case JN_DICT:
        for (size_t i = 0; i < n->dict.keys.n; i++)
            if (!maybe_const(n->dict.keys.v[i]) || !maybe_const(n->dict.vals.v[i])) return false;
        return true;
    case JN_GETATTR: return maybe_const(n->getattr.obj);
    case JN_GETITEM: return maybe_const(n->getitem.obj) && maybe_const(n->getitem.arg);
    case JN_SLICE: return maybe_const(n->slice.start) && maybe_const(n->slice.stop) && maybe_const(n->slice.step);
    case JN_FILTER: case JN_TEST:
        if (!jr_filter_foldable(n) || !maybe_const(n->filter.obj)) return false;
        for (size_t i = 0; i < n->filter.args.pos.n; i++)
            if (!maybe_const(n->filter.args.pos.v[i])) return false;
        for (size_t i = 0; i < n->filter.args.nkw; i++)
            if (!maybe_const(n->filter.args.kw[i].value)) return false;
        return true;
    case JN_NOT: case JN_NEG: case JN_POS: return maybe_const(n->bin.a);
    case JN_BINOP: return maybe_const(n->bin.a) && maybe_const(n->bin.b);
    case JN_COMPARE:
        if (!maybe_const(n->cmp.first)) return false;
        for (size_t i = 0; i < n->cmp.n; i++)
            if (!maybe_const(n->cmp.rest[i])) return false;
        return true;
    default: return false;
    }
}

static bool safe_repr(jv v) {
    switch ((jv_kind)v.k) {
    case JV_NONE: case JV_BOOL: case JV_INT: case JV_FLOAT: case JV_STR: return true;
    case JV_LIST:
        if (v.l->view == JL_RANGE) return true;
        if (v.l->view != JL_PLAIN) return false;
        /* fall through */
    case JV_TUPLE:
        for (size_t i = 0; i < v.l->n; i++)
            if (!safe_repr(v.l->v[i])) return false;
        return true;
    case JV_DICT:
        for (size_t i = 0; i < v.d->n; i++)
            if (!safe_repr(v.d->keys[i]) || !safe_repr(v.d->vals[i])) return false;
        return true;
    default: return false;
    }
}

/* a copy of a safe value in the template's arena */
static jv copy_value(jz *z, jv v) {
    switch ((jv_kind)v.k) {
    case JV_STR: return jv_of_str(js_new(z, v.s->p, v.s->len));
    case JV_LIST:
    case JV_TUPLE: {
        jlist *l = jl_new(z, v.l->n);
        for (size_t i = 0; i < v.l->n; i++) l->v[l->n++] = copy_value(z, v.l->v[i]);
        l->view = v.l->view;
        l->r_start = v.l->r_start;
        l->r_stop = v.l->r_stop;
        l->r_step = v.l->r_step;
        return (jv){.k = v.k, .l = l};
    }
    case JV_DICT: {
        jdict *d = jd_new(z, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) {
            d->keys[i] = copy_value(z, v.d->keys[i]);
            d->vals[i] = copy_value(z, v.d->vals[i]);
        }
        d->n = v.d->n;
        return jv_of_dict(d);
    }
    default: return v;
    }
}

/* evaluates a foldable node; false when jinja2's as_const would give up (an exception) */
static bool fold_eval(const tr_jinja *t, const jnode *n, bool printed, jz *keep, jv *out) {
    jrender *r = calloc(1, sizeof *r);
    if (!r) return false;
    jz_init(&r->z, (size_t)16 << 20);
    r->z.step_limit = 100000;
    r->t = t;
    r->folding = true;
    r->root_ok = jz_alloc(&r->z, t->nsyms + 1);
    r->root = jz_alloc(&r->z, (t->nsyms + 1) * sizeof(jv));
    bool ok = false;
    if (!setjmp(r->z.jb)) {
        const jv v = jr_eval(r, NULL, n);
        if (printed) {
            const jstr *s = jv_to_str(&r->z, v);
            *out = jv_of_str(js_new(keep, s->p, s->len));
            ok = true;
        } else if (safe_repr(v)) {
            *out = copy_value(keep, v);
            ok = true;
        }
    }
    jz_free(&r->z);
    free(r);
    return ok;
}

static void fold(tr_jinja *t, jnode *n);

static void fold_list(tr_jinja *t, jnodes *v) {
    for (size_t i = 0; i < v->n; i++) fold(t, v->v[i]);
}

static void fold_args(tr_jinja *t, jargs *a) {
    fold_list(t, &a->pos);
    for (size_t i = 0; i < a->nkw; i++) fold(t, a->kw[i].value);
    if (a->star) fold(t, a->star);
    if (a->dstar) fold(t, a->dstar);
}

static void fold(tr_jinja *t, jnode *n) {
    if (!n) return;
    switch ((jn_kind)n->kind) {
    case JN_OUTPUT:
        fold_list(t, &n->items);
        for (size_t i = 0; i < n->items.n; i++) {
            jnode *c = n->items.v[i];
            jv v;
            if (c->kind != JN_CONST && foldable(c) && maybe_const(c) && fold_eval(t, c, true, &t->z, &v)) {
                c->kind = JN_CONST;
                c->value = v;
            }
        }
        return;
    case JN_LIST: case JN_TUPLE: case JN_CONCAT: fold_list(t, &n->items); break;
    case JN_DICT: fold_list(t, &n->dict.keys); fold_list(t, &n->dict.vals); break;
    case JN_GETATTR: fold(t, n->getattr.obj); break;
    case JN_GETITEM: fold(t, n->getitem.obj); fold(t, n->getitem.arg); break;
    case JN_SLICE: fold(t, n->slice.start); fold(t, n->slice.stop); fold(t, n->slice.step); return;
    case JN_CALL: fold(t, n->call.fn); fold_args(t, &n->call.args); break;
    case JN_FILTER: case JN_TEST: fold(t, n->filter.obj); fold_args(t, &n->filter.args); break;
    case JN_NOT: case JN_NEG: case JN_POS: fold(t, n->bin.a); break;
    case JN_BINOP: case JN_AND: case JN_OR: fold(t, n->bin.a); fold(t, n->bin.b); break;
    case JN_COMPARE:
        fold(t, n->cmp.first);
        for (size_t i = 0; i < n->cmp.n; i++) fold(t, n->cmp.rest[i]);
        break;
    case JN_CONDEXPR: fold(t, n->cond.cond); fold(t, n->cond.a); fold(t, n->cond.b); break;
    case JN_IF: fold(t, n->if_.test); fold_list(t, &n->if_.body); fold_list(t, &n->if_.else_); return;
    case JN_FOR:
        fold(t, n->for_.iter);
        fold(t, n->for_.filter);
        fold_list(t, &n->for_.body);
        fold_list(t, &n->for_.else_);
        return;
    case JN_SET: fold(t, n->set.value); return;
    case JN_SETBLOCK: fold(t, n->setblock.filter); fold_list(t, &n->setblock.body); return;
    case JN_MACRO:
        for (size_t i = 0; i < n->macro.ndefaults; i++) fold(t, n->macro.defaults[i]);
        fold_list(t, &n->macro.body);
        return;
    case JN_CALLBLOCK: fold(t, n->callblock.call); fold(t, n->callblock.macro); return;
    case JN_FILTERBLOCK: fold_list(t, &n->filterblock.body); return;
    case JN_WITH:
        for (size_t i = 0; i < n->with.n; i++) fold(t, n->with.values[i]);
        fold_list(t, &n->with.body);
        return;
    case JN_SCOPE: fold_list(t, &n->scope.body); return;
    default: return;
    }
    jv v;
    if (n->kind != JN_CONST && foldable(n) && maybe_const(n) && fold_eval(t, n, false, &t->z, &v)) {
        n->kind = JN_CONST;
        n->value = v;
    }
}

void jfold(tr_jinja *t) { fold_list(t, &t->body); }

