/* Symbolic plans (format 1.3, runtime/symbolic.py): size variables bound from the inputs'
 * shapes, relations checked, dim records evaluated, and memory planned per shape by the same
 * first fit as the packager (unbounded), or once for the --max-shape bound (bounded: the arena
 * is allocated at load). The scratch a run needs is allocated at load; an unbounded plan's
 * arena is the exception: it grows, once, when a shape needs more than any before (zeroed
 * pages, as the Python runtime's fresh arena per plan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "model.h"

#define MAX_DIM (1LL << 40)
#define MAX_DEPTH 32
#define ALIGN 64

int mlc_sym_var(const mlc_plan *p, const mp_node *n)
{
    for (size_t i = 0; i < p->sym->nvars; i++)
        if (mp_str_eq(n, p->sym->vars[i]))
            return (int)i;
    return -1;
}

static int dim_ok(const mlc_plan *p, const mp_node *n, int depth)
{
    if (n->type == MP_INT)
        return n->v.i > -MAX_DIM && n->v.i < MAX_DIM;
    if (n->type == MP_STR)
        return mlc_sym_var(p, n) >= 0;
    if (n->type != MP_ARRAY || n->len == 0 || depth >= MAX_DEPTH)
        return 0;
    const mp_node *op = &n->v.items[0];
    if ((mp_str_eq(op, "+") || mp_str_eq(op, "*")) && n->len >= 2) {
        for (uint32_t i = 1; i < n->len; i++)
            if (!dim_ok(p, &n->v.items[i], depth + 1))
                return 0;
        return 1;
    }
    if ((mp_str_eq(op, "//") || mp_str_eq(op, "%")) && n->len == 3)
        return mp_is_int(&n->v.items[2]) && n->v.items[2].v.i > 0 && n->v.items[2].v.i < MAX_DIM
               && dim_ok(p, &n->v.items[1], depth + 1);
    return 0;
}

/* Whether dim record n (validated) names variable v. */
static int names_var(const mlc_plan *p, const mp_node *n, int v)
{
    if (n->type == MP_STR)
        return mlc_sym_var(p, n) == v;
    if (n->type != MP_ARRAY)
        return 0;
    for (uint32_t i = 1; i < n->len; i++)
        if (names_var(p, &n->v.items[i], v))
            return 1;
    return 0;
}

int mlc_sym_counted(const mlc_symbolic *s, size_t v)
{
    for (size_t d = 0; d < s->ndynamic; d++)
        if (s->dyn_var[d] == (int)v)
            return 1;
    return 0;
}

mlc_status mlc_sym_counted_env(const mlc_plan *p, int64_t *env)
{
    const mlc_symbolic *s = p->sym;
    for (size_t d = 0; d < s->ndynamic; d++)
        if (mlc_sym_eval(p, s->dyn_rec[d], env, &env[s->dyn_var[d]]) || env[s->dyn_var[d]] < 0)
            return MLC_ERR_INPUT;
    return MLC_OK;
}

mlc_status mlc_sym_dim(const mlc_plan *p, const mp_node *rec, const char *what, mlc_error *err)
{
    if (rec && dim_ok(p, rec, 0))
        return MLC_OK;
    return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s has a malformed dim record", what);
}

mlc_status mlc_sym_eval(const mlc_plan *p, const mp_node *n, const int64_t *env, int64_t *out)
{
    if (n->type == MP_INT) {
        *out = n->v.i;
        return MLC_OK;
    }
    if (n->type == MP_STR) {
        *out = env[mlc_sym_var(p, n)];
        return MLC_OK;
    }
    const mp_node *op = &n->v.items[0];
    int64_t v, acc;
    if (mp_str_eq(op, "+") || mp_str_eq(op, "*")) {
        int mul = mp_str_eq(op, "*");
        acc = mul;
        for (uint32_t i = 1; i < n->len; i++) {
            if (mlc_sym_eval(p, &n->v.items[i], env, &v))
                return MLC_ERR_BUNDLE;
            if (mul ? __builtin_mul_overflow(acc, v, &acc) : __builtin_add_overflow(acc, v, &acc))
                return MLC_ERR_INPUT;
        }
        *out = acc;
        return MLC_OK;
    }
    if (mlc_sym_eval(p, &n->v.items[1], env, &v))
        return MLC_ERR_INPUT;
    int64_t c = n->v.items[2].v.i, q = v / c, r = v % c;
    if (r && (r < 0) != (c < 0)) {   /* Python's floor division */
        q -= 1;
        r += c;
    }
    *out = mp_str_eq(op, "//") ? q : r;
    return MLC_OK;
}

/* A dim record as text ("N", "h * w", "(h + 1) // 2"), for specs and messages. */
static size_t text(const mp_node *n, char *out, size_t size)
{
    if (!size)
        return 0;
    if (n->type == MP_INT)
        return (size_t)snprintf(out, size, "%lld", (long long)n->v.i);
    if (n->type == MP_STR)
        return (size_t)snprintf(out, size, "%.*s", (int)n->len, (const char *)n->v.p);
    const mp_node *op = &n->v.items[0];
    size_t len = 0;
    if (mp_str_eq(op, "+") || mp_str_eq(op, "*")) {
        for (uint32_t i = 1; i < n->len && len < size; i++) {
            if (i > 1)
                len += (size_t)snprintf(out + len, size - len, mp_str_eq(op, "+") ? " + " : " * ");
            if (len < size)
                len += text(&n->v.items[i], out + len, size - len);
        }
        return len;
    }
    len = (size_t)snprintf(out, size, "(");
    if (len < size)
        len += text(&n->v.items[1], out + len, size - len);
    if (len < size)
        len += (size_t)snprintf(out + len, size - len, ") %.*s %lld", (int)op->len,
                                (const char *)op->v.p, (long long)n->v.items[2].v.i);
    return len;
}

char *mlc_sym_text(mlc_alloc *a, const mp_node *rec)
{
    char buf[256];
    text(rec, buf, sizeof buf);
    char *s = mlc_zalloc(a, strlen(buf) + 1);
    if (s)
        strcpy(s, buf);
    return s;
}

static mlc_status bad(mlc_error *err, const char *what)
{
    return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s is malformed", what);
}

mlc_status mlc_sym_parse(mlc_model *m, const mp_node *rec, mlc_plan *p, mlc_error *err)
{
    mlc_symbolic *s = mlc_zalloc(&m->alloc, sizeof *s);
    if (!s)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    p->sym = s;
    const mp_node *vars = mp_get(rec, "vars"), *bufs = mp_get(rec, "buffers");
    if (rec->type != MP_MAP || !vars || vars->type != MP_ARRAY || !bufs || bufs->type != MP_ARRAY)
        return bad(err, "symbolic record");
    s->nvars = vars->len;
    s->vars = mlc_zalloc(&m->alloc, (vars->len + 1) * sizeof(char *));
    if (!s->vars)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < vars->len; i++)
        if (!(s->vars[i] = mp_strdup(&m->alloc, &vars->v.items[i])))
            return bad(err, "symbolic record vars");
    s->nbuffers = bufs->len;
    size_t nb = bufs->len + 1;
    s->buf_rec = mlc_zalloc(&m->alloc, nb * sizeof(mp_node *));
    s->buf_start = mlc_zalloc(&m->alloc, nb * 8);
    s->buf_end = mlc_zalloc(&m->alloc, nb * 8);
    if (!s->buf_rec || !s->buf_start || !s->buf_end)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < bufs->len; i++) {
        const mp_node *b = &bufs->v.items[i];
        char what[48];
        snprintf(what, sizeof what, "symbolic buffer %u", i);
        if (b->type != MP_ARRAY || b->len != 3 || !mp_is_int(&b->v.items[1])
            || !mp_is_int(&b->v.items[2]) || b->v.items[1].v.i < 0 || b->v.items[2].v.i < 0)
            return bad(err, what);
        mlc_status st = mlc_sym_dim(p, &b->v.items[0], what, err);
        if (st)
            return st;
        s->buf_rec[i] = &b->v.items[0];
        s->buf_start[i] = b->v.items[1].v.i;
        s->buf_end[i] = b->v.items[2].v.i;
    }
    const mp_node *checks = mp_get(rec, "checks");
    if (checks && checks->type != MP_NIL) {
        if (checks->type != MP_ARRAY)
            return bad(err, "symbolic checks");
        s->nchecks = checks->len;
        s->checks = mlc_zalloc(&m->alloc, (checks->len + 1) * sizeof(mp_node *));
        if (!s->checks)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (uint32_t i = 0; i < checks->len; i++) {
            const mp_node *c = &checks->v.items[i];
            if (c->type != MP_ARRAY || c->len != 4
                || !(mp_str_eq(&c->v.items[0], "eq") || mp_str_eq(&c->v.items[0], "le"))
                || c->v.items[3].type != MP_STR || !dim_ok(p, &c->v.items[1], 0)
                || !dim_ok(p, &c->v.items[2], 0))
                return bad(err, "symbolic check");
            s->checks[i] = c;
        }
    }
    const mp_node *dyn = mp_get(rec, "dynamic");
    if (dyn && dyn->type != MP_NIL) {
        if (dyn->type != MP_ARRAY)
            return bad(err, "symbolic dynamic");
        s->ndynamic = dyn->len;
        s->dyn_var = mlc_zalloc(&m->alloc, (dyn->len + 1) * sizeof(int));
        s->dyn_rec = mlc_zalloc(&m->alloc, (dyn->len + 1) * sizeof(mp_node *));
        if (!s->dyn_var || !s->dyn_rec)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (uint32_t i = 0; i < dyn->len; i++) {
            const mp_node *d = &dyn->v.items[i];
            if (d->type != MP_ARRAY || d->len != 2 || d->v.items[0].type != MP_STR
                || mlc_sym_var(p, &d->v.items[0]) < 0 || !dim_ok(p, &d->v.items[1], 0))
                return bad(err, "symbolic dynamic size");
            s->dyn_var[i] = mlc_sym_var(p, &d->v.items[0]);
            s->dyn_rec[i] = &d->v.items[1];
            for (uint32_t j = 0; j < i; j++)
                if (s->dyn_var[j] == s->dyn_var[i])
                    return bad(err, "symbolic dynamic size");
        }
        for (uint32_t i = 0; i < dyn->len; i++)   /* bounds name input sizes only */
            for (uint32_t j = 0; j < dyn->len; j++)
                if (names_var(p, s->dyn_rec[i], s->dyn_var[j]))
                    return bad(err, "symbolic dynamic size");
    }
    const mp_node *values = mp_get(rec, "values"), *scales = mp_get(rec, "scales");
    uint32_t nscales = 0;
    if (scales && scales->type != MP_NIL) {   /* format 1.7: [input, "scales", vars, src] */
        if (scales->type != MP_ARRAY)
            return bad(err, "symbolic scales");
        nscales = scales->len;
    }
    if ((values && values->type != MP_NIL) || nscales) {
        if (values && values->type != MP_NIL && values->type != MP_ARRAY)
            return bad(err, "symbolic values");
        uint32_t nvalues = values && values->type == MP_ARRAY ? values->len : 0;
        s->nvalues = (size_t)nvalues + nscales;
        s->values = mlc_zalloc(&m->alloc, (s->nvalues + 1) * sizeof(mp_node *));
        if (!s->values)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (uint32_t i = 0; i < nscales; i++) {   /* bound after every values row */
            const mp_node *r = &scales->v.items[i];
            if (r->type != MP_ARRAY || r->len != 4 || r->v.items[0].type != MP_STR
                || !mp_str_eq(&r->v.items[1], "scales") || r->v.items[2].type != MP_ARRAY
                || r->v.items[2].len < 1 || r->v.items[2].len > MLC_MAX_DIMS
                || r->v.items[3].type != MP_ARRAY || r->v.items[3].len != r->v.items[2].len)
                return bad(err, "symbolic scales row");
            for (uint32_t k = 0; k < r->v.items[2].len; k++)
                if (r->v.items[2].v.items[k].type != MP_STR
                    || mlc_sym_var(p, &r->v.items[2].v.items[k]) < 0
                    || !dim_ok(p, &r->v.items[3].v.items[k], 0))
                    return bad(err, "symbolic scales row");
            s->values[nvalues + i] = r;
        }
    }
    if (values && values->type == MP_ARRAY) {
        for (uint32_t i = 0; i < values->len; i++) {
            const mp_node *r = &values->v.items[i];
            if (r->type != MP_ARRAY || r->len < 3 || r->v.items[0].type != MP_STR)
                return bad(err, "symbolic values row");
            const mp_node *rule = &r->v.items[1], *vs = &r->v.items[2];
            int axes = mp_str_eq(rule, "axes");
            int slice = mp_str_eq(rule, "slice"), pad = mp_str_eq(rule, "pad");
            uint32_t want = mp_str_eq(rule, "dims") ? 3 : mp_str_eq(rule, "expand") ? 4
                            : mp_str_eq(rule, "reshape") || axes || pad ? 5 : slice ? 7 : 0;
            if (!want || r->len != want || vs->type != MP_ARRAY || vs->len < 1 || vs->len > 64)
                return bad(err, "symbolic values row");
            for (uint32_t k = 0; k < vs->len; k++)
                if (vs->v.items[k].type != MP_STR || mlc_sym_var(p, &vs->v.items[k]) < 0)
                    return bad(err, "symbolic values row");
            if (want >= 4) {
                const mp_node *src = &r->v.items[3];
                if (src->type != MP_ARRAY || src->len > MLC_MAX_DIMS)
                    return bad(err, "symbolic values row");
                for (uint32_t k = 0; k < src->len; k++)
                    if (!dim_ok(p, &src->v.items[k], 0))
                        return bad(err, "symbolic values row");
            }
            if (slice && (r->v.items[4].type != MP_STR || !r->v.items[4].len
                          || r->v.items[5].type != MP_STR || r->v.items[6].type != MP_STR
                          || vs->len != 4 * r->v.items[3].len))
                return bad(err, "symbolic values row");
            if (pad && (r->v.items[4].type != MP_STR || vs->len != 3 * r->v.items[3].len))
                return bad(err, "symbolic values row");
            if (want == 5 && !pad && !(mp_is_int(&r->v.items[4]) && r->v.items[4].v.i >= 0
                               && r->v.items[4].v.i < (axes ? 5 : 2)))
                return bad(err, "symbolic values row");
            s->values[i] = r;
        }
    }
    const mp_node *bound = mp_get(rec, "bound");
    if (bound && bound->type != MP_NIL) {
        const mp_node *sizes = mp_get(bound, "sizes"), *offs = mp_get(bound, "offsets"),
                      *arena = mp_get(bound, "arena_bytes");
        if (bound->type != MP_MAP || !sizes || sizes->type != MP_MAP || sizes->len != s->nvars
            || !offs || offs->type != MP_ARRAY || offs->len != s->nbuffers || !mp_is_int(arena)
            || arena->v.i < 0 || arena->v.i >= MAX_DIM)
            return bad(err, "symbolic bound");
        s->bounded = 1;
        s->bound_arena = (uint64_t)arena->v.i;
        s->bound_vals = mlc_zalloc(&m->alloc, (s->nvars + 1) * 8);
        s->bound_offsets = mlc_zalloc(&m->alloc, nb * 8);
        s->bound_sizes = mlc_zalloc(&m->alloc, nb * 8);
        if (!s->bound_vals || !s->bound_offsets || !s->bound_sizes)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (size_t v = 0; v < s->nvars; v++) {
            const mp_node *x = mp_get(sizes, s->vars[v]);
            if (!mp_is_int(x) || x->v.i < 1 || x->v.i >= MAX_DIM)
                return bad(err, "symbolic bound sizes");
            s->bound_vals[v] = x->v.i;
        }
        for (size_t k = 0; k < s->nbuffers; k++) {
            const mp_node *o = &offs->v.items[k];
            int64_t size;
            if (!mp_is_int(o) || o->v.i < 0 || o->v.i >= MAX_DIM
                || mlc_sym_eval(p, s->buf_rec[k], s->bound_vals, &size) || size < 0
                || (uint64_t)o->v.i + (uint64_t)size > s->bound_arena)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: buffer %zu of the "
                                "bounded plan lies outside its %llu-byte arena", m->name, k,
                                (unsigned long long)s->bound_arena);
            s->bound_offsets[k] = o->v.i;
            s->bound_sizes[k] = size;
        }
    }
    return MLC_OK;
}

mlc_status mlc_sym_alloc(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    mlc_symbolic *s = p->sym;
    size_t nb = s->nbuffers + 1, nt = p->ntensors + 1;
    s->env = mlc_zalloc(&m->alloc, (s->nvars + 1) * 8);
    s->last_env = mlc_zalloc(&m->alloc, (s->nvars + 1) * 8);
    s->sizes = mlc_zalloc(&m->alloc, (s->nvars + 1) * 8);
    s->limits = mlc_zalloc(&m->alloc, (s->nvars + 1) * 8);
    s->buf_bytes = mlc_zalloc(&m->alloc, nb * 8);
    s->offsets = mlc_zalloc(&m->alloc, 3 * nb * 8);   /* offsets, then the busy spans */
    s->order = mlc_zalloc(&m->alloc, nb * sizeof(size_t));
    s->tbytes = mlc_zalloc(&m->alloc, nt * 8);
    s->tdims = mlc_zalloc(&m->alloc, nt * MLC_MAX_DIMS * 8);
    if (!s->env || !s->last_env || !s->sizes || !s->limits || !s->buf_bytes || !s->offsets || !s->order
        || !s->tbytes || !s->tdims)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    if (s->bounded) {
        void *a = mmap(NULL, (size_t)s->bound_arena + ALIGN, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a == MAP_FAILED)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: its bounded memory plan asks for a "
                            "%llu-byte arena, which cannot be allocated here", m->name,
                            (unsigned long long)s->bound_arena);
        s->arena = a;
        s->arena_size = (size_t)s->bound_arena + ALIGN;
    }
    return MLC_OK;
}

void mlc_sym_free(mlc_plan *p)
{
    if (p->sym && p->sym->arena)
        munmap(p->sym->arena, p->sym->arena_size);
    mlc_stores_free(p);
}

static void shape_of(const int64_t *dims, int n, char *out, size_t size)
{
    size_t len = (size_t)snprintf(out, size, "(");
    for (int i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, "%s%lld", i ? ", " : "",
                                (long long)dims[i]);
    if (len < size)
        snprintf(out + len, size - len, "%s)", n == 1 ? "," : "");
}

static void spec_text(const mlc_iorow *io, char *out, size_t size)
{
    size_t len = (size_t)snprintf(out, size, "(");
    for (int i = 0; i < io->ndim && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, "%s%s", i ? ", " : "", io->dim_text[i]);
    if (len < size)
        snprintf(out + len, size - len, "%s)", io->ndim == 1 ? "," : "");
}

/* Format 1.6: size variables bound from inputs' values (runtime/symbolic.py bind_values):
 * "dims" as they are; "reshape" gives 0 (copy the data's dim unless allowzero) and -1 (the
 * count left) ONNX's meaning; "expand" gives 1 the data's dim where that is not 1. Each value
 * must then be at least 1. Rows come in the order the model reads them (a reshape's data dims
 * may use an earlier row's variables). */
mlc_status mlc_sym_bind(mlc_model *m, mlc_plan *p, const mlc_tensor *in, mlc_error *err)
{
    mlc_symbolic *s = p->sym;
    char got[200], want[200];
    int bound_by[64];
    for (size_t v = 0; v < s->nvars; v++)
        s->env[v] = -1;
    for (size_t i = 0; i < p->ninputs; i++) {
        const mlc_iorow *spec = &p->inputs[i];
        const mlc_tensor *t = &in[i];
        if (!(t->dtype == mlc_storage(spec->dtype) || t->dtype == spec->dtype))
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has dtype %s; the model takes %s",
                            spec->name, mlc_dtype_name(t->dtype), mlc_dtype_name(spec->dtype));
        spec_text(spec, want, sizeof want);
        if (t->ndim != spec->ndim) {
            shape_of(t->dims, t->ndim < 0 || t->ndim > MLC_MAX_DIMS ? 0 : t->ndim, got, sizeof got);
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has rank %d (shape %s); the model "
                            "takes %s", spec->name, t->ndim, got, want);
        }
        for (int a = 0; a < t->ndim; a++) {
            int64_t n = t->dims[a];
            if (spec->has_max && n > spec->max_shape[a])
                return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has size %lld at axis %d, beyond "
                                "the bundle's bound %lld (its --max-shape)", spec->name,
                                (long long)n, a, (long long)spec->max_shape[a]);
            if (n <= 0)
                return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has size %lld at axis %d; the "
                                "model takes %s with every size at least 1", spec->name,
                                (long long)n, a, want);
            const mp_node *rec = &spec->rec->v.items[a];
            if (rec->type == MP_STR) {
                int v = mlc_sym_var(p, rec);
                if (s->env[v] >= 0 && s->env[v] != n)
                    return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has %s = %lld at axis %d, "
                                    "but another input gives %s = %lld: they must agree",
                                    spec->name, s->vars[v], (long long)n, a, s->vars[v],
                                    (long long)s->env[v]);
                if (s->env[v] < 0 && v < 64)
                    bound_by[v] = (int)i;
                s->env[v] = n;
            }
        }
    }
    mlc_status st = mlc_sym_values(m, p, in, s->env, bound_by, err);
    if (st)
        return st;
    for (size_t v = 0; v < s->nvars; v++) {
        if (mlc_sym_counted(s, v))
            continue;
        if (s->env[v] < 0)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: size variable %s is bound by no input",
                            m->name, s->vars[v]);
        if (s->bounded && s->env[v] > s->bound_vals[v])
            return mlc_fail(err, MLC_ERR_INPUT, "size %s = %lld (input '%s') is beyond the "
                            "bundle's bound %lld (its --max-shape)", s->vars[v],
                            (long long)s->env[v], v < 64 ? p->inputs[bound_by[v]].name : "?",
                            (long long)s->bound_vals[v]);
    }
    for (size_t c = 0; c < s->nchecks; c++) {
        const mp_node *row = s->checks[c];
        int64_t a, b;
        if (mlc_sym_eval(p, &row->v.items[1], s->env, &a)
            || mlc_sym_eval(p, &row->v.items[2], s->env, &b))
            return mlc_fail(err, MLC_ERR_INPUT, "the inputs' sizes overflow the model's size "
                            "expressions");
        if (mp_str_eq(&row->v.items[0], "eq") ? a != b : a > b)
            return mlc_fail(err, MLC_ERR_INPUT, "%.*s", (int)row->v.items[3].len,
                            (const char *)row->v.items[3].v.p);
    }
    if (mlc_sym_counted_env(p, s->env))   /* planned at their bounds; BIND_SIZE sets them */
        return mlc_fail(err, MLC_ERR_INPUT, "the inputs' sizes overflow the model's size "
                        "expressions");
    for (size_t i = 0; i < p->ninputs; i++) {
        const mlc_iorow *spec = &p->inputs[i];
        for (int a = 0; a < spec->ndim; a++) {
            int64_t v;
            if (mlc_sym_eval(p, &spec->rec->v.items[a], s->env, &v) || v != in[i].dims[a]) {
                shape_of(in[i].dims, in[i].ndim, got, sizeof got);
                spec_text(spec, want, sizeof want);
                return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has shape %s; the model takes "
                                "%s", spec->name, got, want);
            }
        }
        uint64_t need;
        if (mlc_nbytes(in[i].dims, in[i].ndim, spec->dtype, &need) || in[i].nbytes < need
            || (!in[i].data && need))
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': its buffer holds %zu bytes, its "
                            "shape needs more", spec->name, in[i].nbytes);
    }
    return MLC_OK;
}

static uint64_t aligned(uint64_t n)
{
    return ((n ? n : 1) + ALIGN - 1) / ALIGN * ALIGN;
}

/* Offsets by size, largest first, each at the lowest offset free during its life
 * (runtime/symbolic._first_fit, the packager's memory plan); returns the arena's bytes. */
static uint64_t first_fit(mlc_symbolic *s)
{
    size_t n = s->nbuffers;
    uint64_t *off = s->offsets, *busy = s->offsets + n + 1;
    for (size_t i = 0; i < n; i++)
        s->order[i] = i;
    for (size_t i = 1; i < n; i++)   /* insertion sort by (-aligned size, start, index) */
        for (size_t j = i; j > 0; j--) {
            size_t a = s->order[j - 1], b = s->order[j];
            uint64_t sa = aligned(s->buf_bytes[a]), sb = aligned(s->buf_bytes[b]);
            int later = sa < sb || (sa == sb && (s->buf_start[a] > s->buf_start[b]
                                                 || (s->buf_start[a] == s->buf_start[b] && a > b)));
            if (!later)
                break;
            s->order[j - 1] = b;
            s->order[j] = a;
        }
    uint64_t arena = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = s->order[k];
        uint64_t size = aligned(s->buf_bytes[i]);
        size_t nbusy = 0;
        for (size_t q = 0; q < k; q++) {
            size_t pl = s->order[q];
            if (s->buf_start[pl] <= s->buf_end[i] && s->buf_start[i] <= s->buf_end[pl]) {
                /* insert (off, off + size) sorted */
                uint64_t lo = off[pl], hi = off[pl] + aligned(s->buf_bytes[pl]);
                size_t at = nbusy++;
                while (at > 0 && (busy[2 * (at - 1)] > lo
                                  || (busy[2 * (at - 1)] == lo && busy[2 * (at - 1) + 1] > hi))) {
                    busy[2 * at] = busy[2 * (at - 1)];
                    busy[2 * at + 1] = busy[2 * (at - 1) + 1];
                    at--;
                }
                busy[2 * at] = lo;
                busy[2 * at + 1] = hi;
            }
        }
        uint64_t o = 0;
        for (size_t b = 0; b < nbusy; b++) {
            if (o + size <= busy[2 * b])
                break;
            o = o > busy[2 * b + 1] ? o : busy[2 * b + 1];
        }
        off[i] = o;
        arena = arena > o + size ? arena : o + size;
    }
    return arena;
}

mlc_status mlc_sym_plan(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    mlc_symbolic *s = p->sym;
    if (s->have_last && !memcmp(s->env, s->last_env, s->nvars * 8))
        return MLC_OK;
    s->have_last = 0;
    for (size_t v = 0; v < s->nvars; v++)
        s->sizes[v] = s->limits[v] = s->env[v];
    for (size_t k = 0; k < s->nbuffers; k++) {
        int64_t b;
        if (mlc_sym_eval(p, s->buf_rec[k], s->env, &b) || b < 0)
            return mlc_fail(err, MLC_ERR_INPUT, "%s: buffer %zu has no valid size at these input "
                            "sizes", m->name, k);
        if (s->bounded && b > s->bound_sizes[k])
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: buffer %zu needs %lld B at "
                            "these sizes, more than its bounded %lld B", m->name, k, (long long)b,
                            (long long)s->bound_sizes[k]);
        s->buf_bytes[k] = (uint64_t)b;
    }
    uint64_t arena_bytes;
    if (s->bounded) {
        for (size_t k = 0; k < s->nbuffers; k++)
            s->offsets[k] = (uint64_t)s->bound_offsets[k];
        arena_bytes = s->bound_arena;
    } else {
        arena_bytes = first_fit(s);
        if (arena_bytes + ALIGN > s->arena_size) {
            if (s->arena)
                munmap(s->arena, s->arena_size);
            s->arena = NULL;
            void *a = mmap(NULL, (size_t)arena_bytes + ALIGN, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (a == MAP_FAILED) {
                s->arena_size = 0;
                return mlc_fail(err, MLC_ERR_INPUT, "%s: these input sizes need a %llu-byte "
                                "arena, which cannot be allocated here", m->name,
                                (unsigned long long)arena_bytes);
            }
            s->arena = a;
            s->arena_size = (size_t)arena_bytes + ALIGN;
        } else {
            memset(s->arena, 0, (size_t)arena_bytes);   /* as a fresh arena per plan */
        }
    }
    for (size_t i = 0; i < p->ntensors; i++) {
        const mlc_trow *t = &p->tensors[i];
        int64_t *dims = s->tdims + i * MLC_MAX_DIMS;
        int ok = 1;
        for (uint32_t d = 0; d < t->rec->len; d++)
            if (mlc_sym_eval(p, &t->rec->v.items[d], s->env, &dims[d]) || dims[d] < 0)
                ok = 0;
        uint64_t size = 0;
        if (ok && mlc_nbytes(dims, (int)t->rec->len, t->dtype, &size))
            ok = 0;
        s->tbytes[i] = size;
        if (ok && t->kind == T_ARENA && t->ref < s->nbuffers && size <= s->buf_bytes[t->ref])
            p->addr[i] = s->arena + s->offsets[t->ref];
        else if (ok && t->kind == T_CONST && t->ref < m->nconstants
                 && m->constant_bytes[t->ref] == size)
            p->addr[i] = (uint8_t *)m->constant_addr[t->ref];
        else if (ok && t->kind == T_SIZES && t->rec->len == 1 && dims[0] == (int64_t)s->nvars
                 && t->dtype == MLC_INT64)
            p->addr[i] = (uint8_t *)s->sizes;
        else if (ok && t->kind == T_STORE)   /* format 1.9: rows the VM keeps (APPEND) */
            p->addr[i] = NULL;
        else
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: tensor %zu lies outside its "
                            "storage", i);
    }
    for (size_t i = 0; i < p->nprogram; i++) {
        mlc_instr *in = &p->program[i];
        if (in->op == OP_KERNEL) {
            for (uint32_t j = 0; j < in->n; j++)
                in->args[j] = p->addr[in->operands[j]];
        } else if (in->op == OP_LIB) {
            for (uint32_t j = 0; j < in->n; j++) {
                size_t t = (size_t)in->operands[j];
                in->tensors[j].data = p->addr[t];
                in->tensors[j].nbytes = (size_t)s->tbytes[t];
                in->tensors[j].ndim = (int)p->tensors[t].rec->len;
                memcpy(in->tensors[j].dims, s->tdims + t * MLC_MAX_DIMS,
                       sizeof in->tensors[j].dims);
            }
        } else if (in->op == OP_COPY && s->tbytes[in->target] != s->tbytes[in->operands[0]]) {
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: a COPY instruction joins tensors of "
                            "different sizes", m->name);
        }
    }
    memcpy(s->last_env, s->env, s->nvars * 8);
    s->have_last = 1;
    return MLC_OK;
}
