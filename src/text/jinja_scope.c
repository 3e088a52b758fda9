/*
 * What jinja2's compiler decides about a parsed template before it runs: which names each
 * frame starts with as "missing" (its idtracking), and its compile-time errors (an unknown
 * filter or test outside an if, assigning to loop).
 */
#include <stdio.h>
#include <string.h>

#include "text/jinja_internal.h"

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
            jlate_fail(p, n->line, "TemplateAssertionError", msg);
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
    tr_jinja *p; /* the template (its arena) */
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

static void st_define(tr_jinja *p, symtab *t, int sym, uint8_t mode) {
    const int i = st_find(t, sym);
    if (i >= 0) {
        t->mode[i] = mode;
        return;
    }
    if (t->n == t->cap) {
        const size_t cap = t->cap ? t->cap * 2 : 8;
        t->sym = jz_grow(&p->z, t->sym, t->cap * sizeof *t->sym, cap * sizeof *t->sym);
        t->mode = jz_grow(&p->z, t->mode, t->cap, cap);
        t->cap = cap;
    }
    t->sym[t->n] = sym;
    t->mode[t->n++] = mode;
}

static void st_add_store(tr_jinja *p, symtab *t, int sym) {
    if (st_stored(t, sym)) return;
    if (t->nstores == t->cap_stores) {
        const size_t cap = t->cap_stores ? t->cap_stores * 2 : 8;
        t->stores = jz_grow(&p->z, t->stores, t->cap_stores * sizeof(int), cap * sizeof(int));
        t->cap_stores = cap;
    }
    t->stores[t->nstores++] = sym;
}

static symtab st_copy(tr_jinja *p, const symtab *t) {
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
                    a->p->z.line = n->line;
                    jz_unsupported(&a->p->z, "more than 256 names assigned in one if");
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
    case JN_FOR: a_expr(a, n->for_.iter); jn_push(&a->p->z, &a->children, (jnode *)n); break;
    case JN_SET: a_expr(a, n->set.value); a_target(a, n->set.target, false); break;
    case JN_SETBLOCK: a_target(a, n->setblock.target, false); jn_push(&a->p->z, &a->children, (jnode *)n); break;
    case JN_MACRO: a_store(a, n->macro.sym); jn_push(&a->p->z, &a->children, (jnode *)n); break;
    case JN_CALLBLOCK: a_expr(a, n->callblock.call); jn_push(&a->p->z, &a->children, (jnode *)n); break;
    case JN_FILTERBLOCK:
        for (const jnode *f = n->filterblock.filter; f; f = f->filter.obj) a_args(a, &f->filter.args);
        jn_push(&a->p->z, &a->children, (jnode *)n);
        break;
    case JN_WITH:
        for (size_t i = 0; i < n->with.n; i++) a_expr(a, n->with.values[i]);
        jn_push(&a->p->z, &a->children, (jnode *)n);
        break;
    case JN_SCOPE: jn_push(&a->p->z, &a->children, (jnode *)n); break;
    default: break;
    }
}

static void a_stmts(analysis *a, const jnodes *v) {
    for (size_t i = 0; i < v->n; i++) a_stmt(a, v->v[i]);
}

static void analyse_frame(tr_jinja *p, const anc *up, jscope *out, const jnode *owner, int part);

/* the frame's missing names, then its nested frames */
static void finish_frame(analysis *a, jscope *out) {
    size_t n = 0;
    for (size_t i = 0; i < a->t.n; i++) n += a->t.mode[i] == M_UNDEF;
    out->missing = jz_alloc(&a->p->z, (n + 1) * sizeof(int));
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
static void analyse_frame(tr_jinja *p, const anc *up, jscope *out, const jnode *n, int part) {
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

void jscope_analyse(tr_jinja *t) {
    analysis root = {.p = t};
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
