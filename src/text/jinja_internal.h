/*
 * The Jinja engine's private pieces, shared by jinja_*.c and the white-box tests (test_jinja.c).
 *
 * Goal: render chat templates exactly as Python's jinja2 does in Hugging Face's
 * apply_chat_template environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols). Values follow Python's semantics (str()/repr() of lists, dicts, None, floats;
 * int vs float; ordered dicts; lazy generators from select/map), and the error messages are
 * Python's / jinja2's own text. Whatever the engine does not implement fails with an error naming
 * the construct and its line rather than producing different text.
 *
 * Memory: a parse and a render each own one arena (jz). Every allocation of that job comes from
 * it and is released at once when the job ends; errors unwind with longjmp to the job's entry
 * point, which therefore leaks nothing. The arena counts bytes against a limit and the
 * interpreter counts steps and depth, so a hostile template ends with an error instead of
 * exhausting memory, time or the C stack.
 */
#ifndef TR_TEXT_JINJA_INTERNAL_H
#define TR_TEXT_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "text/jinja.h"

/* ---- arena and error context ------------------------------------------------------------------ */

typedef struct jz_chunk jz_chunk;

typedef struct jz {
    jmp_buf jb;
    jz_chunk *chunks;
    size_t bytes, byte_limit;
    uint64_t steps, step_limit;
    int depth, depth_limit;
    int line; /* template line of what is being parsed or evaluated */
    /* the error, once failed */
    tr_status status;
    char kind[40]; /* Python exception class: TemplateSyntaxError, UndefinedError, TypeError ... */
    char msg[900];
    int err_line;
} jz;

void jz_init(jz *z, size_t byte_limit);
void jz_free(jz *z);
void *jz_alloc(jz *z, size_t n);                      /* zeroed */
void *jz_grow(jz *z, void *p, size_t old, size_t n); /* like realloc within the arena */
char *jz_strndup(jz *z, const char *s, size_t n);
/* fail with a Python exception class name and message; never returns */
_Noreturn void jz_fail(jz *z, const char *kind, const char *fmt, ...) TR_PRINTF(3, 4);
/* the same with a status of its own (TR_E_ARG for bad input rather than a template error) */
_Noreturn void jz_fail_st(jz *z, tr_status st, const char *kind, const char *fmt, ...) TR_PRINTF(4, 5);
/* fail: a construct the engine does not implement */
_Noreturn void jz_unsupported(jz *z, const char *fmt, ...) TR_PRINTF(2, 3);
/* fail: out of memory or over the byte limit */
_Noreturn void jz_oom(jz *z);

/* growing byte buffer in an arena */
typedef struct jbuf {
    char *p;
    size_t len, cap;
} jbuf;
void jb_put(jz *z, jbuf *b, const char *s, size_t n);
void jb_puts(jz *z, jbuf *b, const char *s);
void jb_putc(jz *z, jbuf *b, char c);
void jb_printf(jz *z, jbuf *b, const char *fmt, ...) TR_PRINTF(3, 4);
void jb_put_cp(jz *z, jbuf *b, uint32_t cp); /* UTF-8 encode (surrogates as 3 bytes) */

/* ---- UTF-8 and Python's Unicode predicates (jinja_unicode.c) ---------------------------------- */

/* decodes one code point at s[*i] (advancing *i); invalid bytes were refused on input, so this
 * only has to handle well-formed text and lone surrogates written by \ud800-style escapes */
uint32_t ju_next(const char *s, size_t len, size_t *i);
size_t ju_count(const char *s, size_t len);        /* code points */
bool ju_valid(const char *s, size_t len);          /* well-formed UTF-8, no surrogates */
bool ju_isspace(uint32_t c);                       /* str.isspace */
bool ju_isprintable(uint32_t c);                   /* str.isprintable */
bool ju_isalpha(uint32_t c);
bool ju_isdecimal(uint32_t c);
bool ju_isdigit(uint32_t c);
bool ju_isnumeric(uint32_t c);
bool ju_islower(uint32_t c);
bool ju_isupper(uint32_t c);
bool ju_iscased(uint32_t c);
bool ju_case_ignorable(uint32_t c);
/* full case mappings (up to 3 code points, returns how many) */
int ju_upper(uint32_t c, uint32_t out[3]);
int ju_lower(uint32_t c, uint32_t out[3]);
int ju_title(uint32_t c, uint32_t out[3]);

/* ---- values ----------------------------------------------------------------------------------- */

typedef enum jv_kind {
    JV_UNDEF = 0,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_TUPLE,
    JV_DICT,
    JV_NS,    /* namespace() */
    JV_GEN,   /* a generator (select, map, unique, items, reverse ...): lazy, single pass */
    JV_FUNC,  /* a builtin function or bound method */
    JV_MACRO, /* a macro (or a call block's caller) */
    JV_LOOP,  /* a for loop's `loop` */
    JV_CYCLER,
    JV_JOINER,
} jv_kind;

/* how a list prints: a plain list, or one of Python's views and range */
enum { JL_PLAIN = 0, JL_KEYS, JL_VALUES, JL_ITEMS, JL_RANGE };

typedef struct jstr jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jundef jundef;
typedef struct jgen jgen;
typedef struct jfunc jfunc;
typedef struct jmacro jmacro;
typedef struct jloop jloop;
typedef struct jobj jobj;

typedef struct jv {
    uint8_t k; /* jv_kind */
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d; /* JV_DICT and JV_NS */
        jundef *u;
        jgen *g;
        jfunc *fn;
        jmacro *m;
        jloop *loop;
        jobj *o;
        void *p;
    };
} jv;

struct jstr {
    size_t len; /* bytes */
    size_t ncp; /* code points; == len for ASCII */
    char p[];   /* NUL-terminated */
};

struct jlist {
    size_t n, cap;
    jv *v;
    uint8_t view;              /* JL_* */
    int64_t r_start, r_stop, r_step; /* JL_RANGE: what repr() shows */
};

struct jdict {
    size_t n, cap;
    jv *keys, *vals;
};

struct jundef {
    const char *hint; /* a message of its own, else built from obj/name */
    bool has_obj;
    bool security;    /* using it raises SecurityError (an unsafe attribute) */
    jv obj;           /* the object whose attribute or item was missing */
    jv name;          /* the name (str) or item (int, ...) asked for */
};

struct jobj { /* cycler and joiner state */
    jlist *items;
    size_t pos;
    jstr *sep;
    bool used;
};

#define JV_NONE_V ((jv){.k = JV_NONE})
#define JV_UNDEF_V ((jv){.k = JV_UNDEF})

static inline jv jv_bool(bool b) { return (jv){.k = JV_BOOL, .b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.k = JV_INT, .i = i}; }
static inline jv jv_float(double f) { return (jv){.k = JV_FLOAT, .f = f}; }
static inline jv jv_of_str(jstr *s) { return (jv){.k = JV_STR, .s = s}; }
static inline jv jv_of_list(jlist *l) { return (jv){.k = JV_LIST, .l = l}; }
static inline jv jv_of_tuple(jlist *l) { return (jv){.k = JV_TUPLE, .l = l}; }
static inline jv jv_of_dict(jdict *d) { return (jv){.k = JV_DICT, .d = d}; }
static inline bool jv_is_seq(jv v) { return v.k == JV_LIST || v.k == JV_TUPLE; }
static inline bool jv_is_num(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }

/* strings */
jstr *js_new(jz *z, const char *s, size_t len); /* copies; counts code points */
jstr *js_cstr(jz *z, const char *s);
jv jv_str(jz *z, const char *s, size_t len);
jv jv_cstr(jz *z, const char *s);
extern jstr js_empty;
bool js_eq(const jstr *a, const jstr *b);
bool js_eqc(const jstr *a, const char *s);
/* byte offset of code point index ci (0 <= ci <= ncp) */
size_t js_offset(const jstr *s, size_t ci);

/* containers */
jlist *jl_new(jz *z, size_t cap);
void jl_push(jz *z, jlist *l, jv v);
jv jv_tuple2(jz *z, jv a, jv b);
jdict *jd_new(jz *z, size_t cap);
/* Python dict semantics: keys compared with == (1, 1.0 and True are one key); a new key keeps
 * its first position, assigning an existing one replaces the value in place. Unhashable keys
 * raise TypeError. */
void jd_set(jz *z, jdict *d, jv key, jv val);
bool jd_get(jz *z, const jdict *d, jv key, jv *out);
bool jd_getc(const jdict *d, const char *key, jv *out); /* string key, no hashing checks */
jundef *ju_undef(jz *z, const char *hint);
jv jv_undef_named(jz *z, const char *name);           /* 'name' is undefined */
jv jv_undef_attr(jz *z, jv obj, jv name);             /* 'dict object' has no attribute 'x' */
jv jv_undef_hint(jz *z, const char *hint);

/* Python's behaviour */
const char *jv_type_name(jv v);    /* type(v).__name__: "str", "NoneType", "dict" ... */
const char *jv_type_repr(jz *z, jv v); /* jinja2's object_type_repr: "dict object", "None" */
bool jv_truthy(jz *z, jv v);
bool jv_eq(jz *z, jv a, jv b);
/* a < b, Python's ordering; TypeError for unorderable types (op names the operator) */
bool jv_lt(jz *z, jv a, jv b, const char *op);
int jv_cmp(jz *z, jv a, jv b, const char *op); /* -1/0/1 via jv_lt, for sorting */
void jv_check_hashable(jz *z, jv v);
_Noreturn void jv_fail_undefined(jz *z, jv u); /* raise the UndefinedError an Undefined carries */
jstr *jv_to_str(jz *z, jv v);                  /* str(v) */
void jv_write_str(jz *z, jbuf *b, jv v);       /* str(v) appended */
void jv_write_repr(jz *z, jbuf *b, jv v);      /* repr(v) appended */
void jv_write_float(jbuf *b, jz *z, double f); /* float.__repr__ */
void jv_write_str_repr(jz *z, jbuf *b, const char *s, size_t len); /* repr() of a str */

/* JSON: json.loads (int/float kept apart, key order kept, duplicate keys: last value wins) and
 * json.dumps (ensure_ascii, indent: NULL for none, separators: NULL for the default) */
jv jv_from_json(jz *z, const char *text, size_t len, const char *what);
typedef struct jjson_opts {
    bool ensure_ascii, sort_keys;
    bool has_indent;
    jstr *indent;               /* the indent unit (spaces for an int) */
    jstr *item_sep, *key_sep;   /* NULL: json's defaults */
} jjson_opts;
void jv_write_json(jz *z, jbuf *b, jv v, const jjson_opts *o);

/* iteration: a list of the items of an iterable (a generator is consumed); TypeError for values
 * that are not iterable; Undefined iterates as empty */
jlist *jv_iter_list(jz *z, jv v);
/* the next item of a generator; false when it is exhausted (jinja_builtins.c) */
bool jg_next(jz *z, jgen *g, jv *out);
const char *jg_type_name(const jgen *g); /* "generator", "list_reverseiterator" ... */

/* ---- AST -------------------------------------------------------------------------------------- */

typedef enum jn_kind {
    /* statements */
    JN_DATA,      /* literal text */
    JN_OUTPUT,    /* {{ expr }} */
    JN_IF,        /* a: test, body, else_ (elif chains nest as an If in else_) */
    JN_FOR,
    JN_SET,       /* target = expr */
    JN_SETBLOCK,  /* {% set x %}...{% endset %} with an optional filter chain */
    JN_MACRO,
    JN_CALLBLOCK,
    JN_FILTERBLOCK,
    JN_WITH,
    JN_BREAK,
    JN_CONTINUE,
    JN_SCOPE,     /* a body with no scope of its own ({% generation %}) */
    JN_UNSUPPORTED_STMT,
    /* expressions */
    JN_CONST,
    JN_NAME,
    JN_NSREF,     /* ns.attr as an assignment target */
    JN_LIST,
    JN_TUPLE,
    JN_DICT,
    JN_GETATTR,
    JN_GETITEM,
    JN_SLICE,
    JN_CALL,
    JN_FILTER,
    JN_TEST,
    JN_NOT,
    JN_NEG,
    JN_POS,
    JN_BINOP,     /* op: + - * / // % ** */
    JN_CONCAT,    /* ~ chain */
    JN_AND,
    JN_OR,
    JN_COMPARE,
    JN_CONDEXPR,
} jn_kind;

typedef enum jop {
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
} jop;

typedef struct jnode jnode;

typedef struct jnodes {
    jnode **v;
    size_t n;
} jnodes;

typedef struct jkwarg {
    jstr *name;
    jnode *value;
} jkwarg;

/* arguments of a call, filter or test */
typedef struct jargs {
    jnodes pos;
    jkwarg *kw;
    size_t nkw;
    jnode *star, *dstar; /* *args, **kwargs */
} jargs;

/* the names a frame starts with as "missing": assigned in the frame before anything read them
 * there, so nested frames that read them before the assignment see them undefined (jinja2's
 * VAR_LOAD_UNDEFINED), whatever the render variables hold */
typedef struct jscope {
    int *missing;
    size_t n;
} jscope;

typedef struct jsym {
    jstr *name;
    int global;   /* index in the globals table, or -1 */
} jsym;

struct jnode {
    uint8_t kind;  /* jn_kind */
    uint8_t op;    /* jop for BINOP */
    bool is_elif;  /* IF: made from an {% elif %} */
    int line;
    jscope sc, sc_else; /* the frames this statement opens (FOR: body and else) */
    union {
        jstr *text;                               /* DATA */
        jv value;                                 /* CONST */
        struct { int sym; } name;                 /* NAME */
        struct { int sym; jstr *attr; } nsref;    /* NSREF */
        jnodes items;                             /* LIST, TUPLE, CONCAT, OUTPUT(1) */
        struct { jnodes keys, vals; } dict;
        struct { jnode *obj; jstr *attr; } getattr;
        struct { jnode *obj, *arg; } getitem;
        struct { jnode *start, *stop, *step; } slice;
        struct { jnode *fn; jargs args; } call;
        struct { jnode *obj; jstr *name; int id; jargs args; } filter; /* TEST too */
        struct { jnode *a, *b; } bin;             /* BINOP, AND, OR; NOT/NEG/POS use a */
        struct { jnode *first; jop *ops; jnode **rest; size_t n; } cmp;
        struct { jnode *cond, *a, *b; } cond;     /* CONDEXPR: a if cond else b (b may be NULL) */
        struct { jnode *test; jnodes body, else_; } if_;
        struct {
            jnode *target, *iter, *filter;
            jnodes body, else_;
            bool recursive;
        } for_;
        struct { jnode *target, *value; } set;
        struct { jnode *target; jnode *filter; jnodes body; } setblock; /* filter: chain, obj NULL */
        struct {
            jstr *name;
            int sym;
            int *params; /* symbols */
            size_t nparams;
            jnode **defaults; /* for the last ndefaults params */
            size_t ndefaults;
            jnodes body;
            bool uses_varargs, uses_kwargs, uses_caller;
        } macro;
        struct { jnode *call; jnode *macro; } callblock; /* macro: the caller (a JN_MACRO) */
        struct { jnode *filter; jnodes body; } filterblock;
        struct { jnode **targets, **values; size_t n; jnodes body; } with;
        struct { jnodes body; } scope;
        struct { jstr *what; } unsupported;
    };
};

/* a parsed template */
struct tr_jinja {
    jz z;          /* owns everything below */
    jnodes body;
    jscope sc;     /* the template's own frame */
    /* jinja2's compile-time errors, raised once the whole template parsed */
    bool has_late;
    int late_line;
    char late_kind[40], late_msg[300];
    jsym *syms;
    size_t nsyms;
};

/* lexer tokens */
typedef enum jt_kind {
    JT_EOF = 0,
    JT_ERROR, /* the lexer failed here: jinja2 lexes on demand, so it fails only when the parser
                 reaches this point (an earlier parse error wins) */
    JT_DATA,
    JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT,
    /* operators */
    JT_ADD, JT_SUB, JT_DIV, JT_FLOORDIV, JT_MUL, JT_MOD, JT_POW, JT_TILDE,
    JT_LBRACKET, JT_RBRACKET, JT_LPAREN, JT_RPAREN, JT_LBRACE, JT_RBRACE,
    JT_EQ, JT_NE, JT_GT, JT_GTEQ, JT_LT, JT_LTEQ, JT_ASSIGN, JT_DOT, JT_COLON, JT_PIPE,
    JT_COMMA, JT_SEMICOLON,
} jt_kind;

typedef struct jtok {
    uint8_t kind;
    int line;
    jstr *s;     /* DATA text, NAME, STRING value; ERROR: the message */
    const char *err_kind; /* ERROR: the exception class */
    int64_t i;   /* INT */
    double f;    /* FLOAT */
} jtok;

/* a growing list of nodes in an arena */
typedef struct nvec {
    jnode **v;
    size_t n, cap;
} nvec;
void jn_push(jz *z, nvec *v, jnode *x);

/* tokenizes the whole template (jinja2's lexer with trim_blocks and lstrip_blocks) */
void jlex(jz *z, const char *src, size_t len, jtok **toks, size_t *ntoks);
const char *jt_describe(const jtok *t); /* jinja2's describe_token */

/* ---- the parser's shared pieces (jinja_parse.c: tokens and expressions, jinja_stmt.c) -------- */

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

const jtok *jp_cur(const parser *p);
const jtok *jp_next_tok(parser *p);
void jp_check_error(const parser *p, const jtok *t);
const jtok *jp_expect(parser *p, jt_kind k);
void jp_expect_name(parser *p, const char *v);
bool jp_is_name(const jtok *t, const char *v);
bool jp_skip_if(parser *p, jt_kind k);
bool jp_skip_name(parser *p, const char *v);
const char *jp_describe_expr(const char *e);
_Noreturn void jp_pfail(parser *p, int line, const char *fmt, ...) TR_PRINTF(3, 4);
void jp_late_fail(parser *p, int line, const char *kind, const char *msg);
jnode *jp_mk(parser *p, jn_kind k, int line);
void jp_nv_push(parser *p, nvec *v, jnode *x);
jnodes jp_nv_done(nvec v);
int jp_sym_of(parser *p, const jstr *name);
jnode *jp_parse_expression(parser *p, bool with_condexpr);
jnode *jp_parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                      bool explicit_parens, bool with_namespace);
jnode *jp_parse_primary(parser *p, bool with_namespace);
jnode *jp_parse_filter(parser *p, jnode *node, bool start_inline);

/* the parser: builds t->body and the symbol table */
void jparse(tr_jinja *t, const jtok *toks, size_t ntoks);
/* jinja2's symbol analysis of every frame (jinja_scope.c) */
void jscope_analyse(tr_jinja *t);
/* jinja2's constant folding (jinja_fold.c), then its compile-time checks on the folded tree
 * (jinja_scope.c; fails the parse) */
void jfold(tr_jinja *t);
void jcheck(tr_jinja *t);
/* records a compile-time error, raised by jcheck (the first one wins) */
void jlate_fail(tr_jinja *t, int line, const char *kind, const char *msg);

/* ---- rendering (jinja_eval.c) ------------------------------------------------------------------ */

/* a scope: the variables one template body, loop iteration, macro call ... assigned */
typedef struct jframe jframe;
struct jframe {
    jframe *parent;
    bool captured; /* a macro closes over it: it must outlive its loop iteration */
    int *syms;
    jv *vals;
    size_t n, cap;
};

struct jmacro {
    const jnode *node;       /* a JN_MACRO */
    const jnode *scope_node; /* whose jscope its frame starts with (the macro, or a call block) */
    jframe *closure;   /* where it was defined: it sees that scope as it is when called */
};

struct jloop {
    jlist *items;       /* the items taken so far (after the loop's `if`) */
    size_t index0;
    int depth0;
    bool has_changed;
    jv last_changed;
    const jnode *node;  /* the for loop, for recursive calls */
    jframe *frame;      /* the frame the loop runs in */
    /* the source, taken from as jinja2's LoopContext does: one item at a time, all of them when
     * loop.length is asked, one ahead for loop.last / loop.nextitem */
    jv src;
    const jlist *src_list;
    size_t src_pos;
    bool src_done;
    jframe *test_frame;
};

struct jfunc {
    int id;           /* a builtin (jinja_methods.c) */
    const char *name; /* for messages */
    jv self;          /* the bound object for methods */
};

typedef struct jrender {
    jz z; /* first: a render's jz pointer is its jrender */
    const tr_jinja *t;
    jdict *vars;   /* the render's variables */
    jv *root;      /* per symbol: its variable or global, looked up once */
    bool *root_ok;
    bool has_now;
    struct tm now;
    bool folding; /* evaluating constants at parse time, as jinja2's optimizer does */
} jrender;

#define JR(zp) ((jrender *)(zp))

jv jr_getattr(jrender *r, jv obj, jstr *name);
jv jr_getitem(jrender *r, jv obj, jv key);
jv jr_call(jrender *r, jv fn, jlist *args, jdict *kw);
jv jr_slice(jrender *r, jv obj, jv start, jv stop, jv step);
jv jr_eval(jrender *r, jframe *f, const jnode *n);
jv jr_binop(jrender *r, jop op, jv a, jv b); /* + - * / // % ** */
jv jr_unary(jrender *r, bool neg, jv v);     /* -x, +x */
/* can jinja2's optimizer evaluate this filter or test at compile time? (jinja_fold.c) */
bool jr_filter_foldable(const jnode *n);
/* takes items from the loop's source until item k exists; false if the source ends first */
bool jr_loop_have(jrender *r, jloop *l, size_t k);

/* ---- builtins (jinja_builtins.c) -------------------------------------------------------------- */

int jb_filter_id(const char *name);  /* -1 if jinja2 has no such filter */
int jb_test_id(const char *name);    /* -1 if jinja2 has no such test */
int jb_global_id(const char *name);  /* -1 if not a global */
jv jb_global(jrender *r, int id);
/* apply filter / test `id` (name for messages; id < 0: jinja2's "No filter named" at runtime) */
jv jb_filter(jrender *r, int id, const char *name, jv v, jlist *args, jdict *kw);
bool jb_test(jrender *r, int id, const char *name, jv v, jlist *args, jdict *kw);
jv jb_call(jrender *r, jfunc *fn, jlist *args, jdict *kw);
/* Python attributes of builtin types (str/dict/list methods, loop and macro attributes ...):
 * true and *out when obj has the attribute */
bool jb_attr(jrender *r, jv obj, const jstr *name, jv *out);

/* generators (jinja_gen.c): made by the filters, stepped by jg_next */
enum { JG_SELECT, JG_MAP, JG_UNIQUE, JG_ITEMS, JG_REVERSE, JG_BATCH, JG_SLICE };

struct jgen {
    uint8_t kind;
    bool started, done;
    const char *type_name; /* generator, list_reverseiterator ... */
    jrender *r;
    jv src;
    jlist *items; /* the source's items when it is not a generator */
    size_t pos;
    /* select / reject / selectattr / rejectattr */
    bool reject, by_attr, truth_only;
    jlist *attr_parts;
    int test_id;
    const char *test_name;
    /* map: a filter or an attribute */
    bool map_attr;
    int filter_id;
    const char *filter_name;
    jv dflt;
    bool has_dflt;
    jlist *args;
    jdict *kw;
    /* unique */
    jlist *seen;
    bool case_sensitive;
    /* batch / slice */
    int64_t count;
    jv fill;
    bool has_fill;
    int64_t slice_no, per_slice, with_extra, offset;
};
jgen *jg_new(jrender *r, int kind, jv src);
jv jv_of_gen(jgen *g);
/* map(attribute=...) / selectattr paths: "a.b.0" as keys ['a', 'b', 0] */
jlist *jb_attr_parts(jrender *r, jv attribute);
jv jb_attr_path(jrender *r, jv item, const jlist *parts, const jv *dflt);
jv jb_ignore_case(jrender *r, jv v); /* lower() for strings, as the filters' case_sensitive=False */

/* Python-style binding of arguments to parameters named in `params` (np of them, the first nreq
 * required): out[i] receives the argument, given[i] whether there was one. fn names the callable
 * in TypeError messages; `self_n` positional arguments come before args (a filter's or test's
 * value) and count in those messages. */
void jb_bind(jrender *r, const char *fn, const char *const *params, size_t np, size_t nreq,
             size_t self_n, const jlist *args, const jdict *kw, jv *out, bool *given);
/* builtin function and method ids (jinja_methods.c; str methods in jinja_str.c) */
enum {
    G_RANGE = 0, G_DICT, G_NAMESPACE, G_CYCLER, G_JOINER, G_LIPSUM, G_RAISE, G_STRFTIME, G_COUNT_,
    /* str */
    S_CAPITALIZE = 100, S_CASEFOLD, S_CENTER, S_COUNT, S_ENDSWITH, S_FIND, S_FORMAT, S_INDEX,
    S_ISALNUM, S_ISALPHA, S_ISASCII, S_ISDECIMAL, S_ISDIGIT, S_ISIDENTIFIER, S_ISLOWER,
    S_ISNUMERIC, S_ISPRINTABLE, S_ISSPACE, S_ISTITLE, S_ISUPPER, S_JOIN, S_LJUST, S_LOWER,
    S_LSTRIP, S_PARTITION, S_REMOVEPREFIX, S_REMOVESUFFIX, S_REPLACE, S_RFIND, S_RINDEX,
    S_RJUST, S_RPARTITION, S_RSPLIT, S_RSTRIP, S_SPLIT, S_SPLITLINES, S_STARTSWITH, S_STRIP,
    S_SWAPCASE, S_TITLE, S_UPPER, S_ZFILL,
    /* dict, list, tuple, range */
    D_GET = 200, D_ITEMS, D_KEYS, D_VALUES, D_COPY,
    L_COUNT, L_INDEX, L_COPY,
    /* jinja2 objects */
    O_LOOP_CYCLE = 300, O_LOOP_CHANGED, O_CYCLER_NEXT, O_CYCLER_RESET,
    UNSUPPORTED_METHOD = 999,
};
jv jb_call_str(jrender *r, jfunc *fn, jlist *args, jdict *kw);
/* Python's errors for builtin methods' arguments */
void jb_no_kwargs(jrender *r, const char *fn, const jdict *kw);
void jb_nargs(jrender *r, const char *fn, const jlist *args, size_t lo, size_t hi);
jstr *jb_want_str(jrender *r, jv v, const char *what);
int64_t jb_want_int(jrender *r, jv v, const char *what);
jv jb_add(jrender *r, jv a, jv b);    /* Python's a + b */
jv jb_mod(jrender *r, jv a, jv b);    /* Python's a % b */
bool jb_in(jrender *r, jv needle, jv hay);

/* str() then the string operations the filters share (Python's str methods) */
jstr *jb_soft_str(jrender *r, jv v);
jstr *js_strip(jz *z, const jstr *s, const jstr *chars, bool left, bool right);
jstr *js_lower(jz *z, const jstr *s);
jstr *js_upper(jz *z, const jstr *s);
jstr *js_capitalize(jz *z, const jstr *s);
jstr *js_replace(jz *z, const jstr *s, const jstr *old, const jstr *new_, int64_t count);
jlist *js_splitlines(jz *z, const jstr *s, bool keepends);
uint32_t *js_cps(jz *z, const jstr *s, size_t *n); /* the code points */
jstr *js_from_cps(jz *z, const uint32_t *cp, size_t n);
bool js_islower(const jstr *s);
bool js_isupper(const jstr *s);

#endif
