/* The header's records, validated as runtime/header.py validates them (types, ranges, payload
 * bounds and overlaps, plans and batch, specialized plans, golden pair), before anything is
 * mapped; each failure one "bundle header: <what> <why>" line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define ALIGN 64
#define MAX_DIM (1LL << 40)
#define MAX_PLANS 64

/* ---- small validators; each fails with "bundle header: <what> <why>" ---- */

static mlc_status bad(mlc_error *err, const char *what, const char *why)
{
    return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s %s", what, why);
}

static int in_range(const mp_node *n, int64_t lo, int64_t hi)
{
    return mp_is_int(n) && n->v.i >= lo && n->v.i < hi;
}

static mlc_status get_int(const mp_node *n, const char *what, int64_t lo, int64_t hi,
                          int64_t *out, mlc_error *err)
{
    if (!in_range(n, lo, hi)) {
        char why[96];
        snprintf(why, sizeof why, "is not an integer in [%lld, %lld)", (long long)lo,
                 (long long)hi);
        return bad(err, what, why);
    }
    *out = n->v.i;
    return MLC_OK;
}

static mlc_status get_str(mlc_model *m, const mp_node *n, const char *what, char **out,
                          mlc_error *err)
{
    if (!n || n->type != MP_STR)
        return bad(err, what, "is not a string");
    *out = mp_strdup(&m->alloc, n);
    return *out ? MLC_OK : mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
}

static mlc_status get_list(const mp_node *n, const char *what, int nonempty, mlc_error *err)
{
    if (!n || n->type != MP_ARRAY || (nonempty && n->len == 0))
        return bad(err, what, nonempty ? "must be a non-empty list" : "must be a list");
    return MLC_OK;
}

static mlc_status get_map(const mp_node *n, const char *what, mlc_error *err)
{
    return n && n->type == MP_MAP ? MLC_OK : bad(err, what, "is not a map");
}

static mlc_status get_ref(const mlc_model *m, const mp_node *n, const char *what, mlc_ref *ref,
                          mlc_error *err)
{
    const mp_node *off = mp_get(n, "offset"), *size = mp_get(n, "size");
    if (!n || n->type != MP_MAP)
        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s is not a payload record", what);
    if (!mp_is_int(off) || !mp_is_int(size) || off->v.i < 0 || size->v.i < 0)
        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s has an invalid offset/size",
                        what);
    if (off->v.i % ALIGN)
        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s is not %d-byte aligned", what,
                        ALIGN);
    if ((uint64_t)off->v.i > m->data_size || (uint64_t)size->v.i > m->data_size - (uint64_t)off->v.i)
        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s points past the end of the "
                        "file (%lld+%lld > %zu)", what, (long long)off->v.i,
                        (long long)size->v.i, m->data_size);
    ref->off = (uint64_t)off->v.i;
    ref->size = (uint64_t)size->v.i;
    return MLC_OK;
}

static mlc_status get_shape(const mp_node *n, const char *what, int *ndim, int64_t *shape,
                            mlc_error *err)
{
    if (!n || n->type != MP_ARRAY || n->len > MLC_MAX_DIMS)
        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s has an invalid shape", what);
    for (uint32_t i = 0; i < n->len; i++) {
        if (!in_range(&n->v.items[i], 0, MAX_DIM))
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s has an invalid shape",
                            what);
        shape[i] = n->v.items[i].v.i;
    }
    *ndim = (int)n->len;
    return MLC_OK;
}

static mlc_status get_dtype(const mp_node *n, const char *what, mlc_dtype *out, mlc_error *err)
{
    for (int d = 0; d < MLC_DTYPE_COUNT; d++)
        if (mp_str_eq(n, mlc_dtype_name((mlc_dtype)d))) {
            *out = (mlc_dtype)d;
            return MLC_OK;
        }
    return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s has an unsupported dtype", what);
}

static int is_version(const mp_node *n)
{
    return n && n->type == MP_ARRAY && n->len == 2 && mp_is_int(&n->v.items[0])
           && mp_is_int(&n->v.items[1]);
}

/* ---- header records ---- */

/* A symbolic shape: at most 16 dims, each an int in [0, 2**40) or a dim record. */
static mlc_status sym_shape(mlc_plan *p, const mp_node *n, const char *what, mlc_error *err)
{
    if (!n || n->type != MP_ARRAY || n->len > MLC_MAX_DIMS)
        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s has an invalid shape", what);
    for (uint32_t i = 0; i < n->len; i++) {
        const mp_node *d = &n->v.items[i];
        if (d->type == MP_INT ? !in_range(d, 0, MAX_DIM) : mlc_sym_dim(p, d, what, err) != MLC_OK)
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s has an invalid shape", what);
    }
    return MLC_OK;
}

static mlc_status parse_io(mlc_model *m, mlc_plan *p, const mp_node *list, const char *at,
                           const char *kind, size_t ntensors, mlc_iorow **out, size_t *count,
                           mlc_error *err)
{
    char what[160];
    snprintf(what, sizeof what, "%s%s", at, kind);
    mlc_status s = get_list(list, what, 1, err);
    if (s)
        return s;
    *count = list->len;
    *out = mlc_zalloc(&m->alloc, list->len * sizeof(mlc_iorow));
    if (!*out)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < list->len; i++) {
        const mp_node *r = &list->v.items[i];
        mlc_iorow *io = &(*out)[i];
        snprintf(what, sizeof what, "%s%s[%u]", at, kind, i);
        if ((s = get_map(r, what, err)))
            return s;
        if (p->sym) {
            io->rec = mp_get(r, "shape");
            if ((s = sym_shape(p, io->rec, what, err)))
                return s;
            io->ndim = (int)io->rec->len;
            for (int d = 0; d < io->ndim; d++) {
                io->dim_text[d] = mlc_sym_text(&m->alloc, &io->rec->v.items[d]);
                io->shape[d] = io->rec->v.items[d].type == MP_INT ? io->rec->v.items[d].v.i : -1;
            }
        } else if ((s = get_shape(mp_get(r, "shape"), what, &io->ndim, io->shape, err))) {
            return s;
        }
        const mp_node *bound = mp_get(r, "max_shape");
        if (bound && bound->type != MP_NIL) {
            char w2[200];
            int nd;
            snprintf(w2, sizeof w2, "%s max_shape", what);
            if ((s = get_shape(bound, w2, &nd, io->max_shape, err)))
                return s;
            if (nd != io->ndim)
                return bad(err, w2, "does not match its shape's rank");
            io->has_max = 1;
        }
        io->views = mp_get(r, "views");
        char w2[200];
        snprintf(w2, sizeof w2, "%s name", what);
        if ((s = get_str(m, mp_get(r, "name"), w2, &io->name, err)))
            return s;
        if ((s = get_dtype(mp_get(r, "dtype"), what, &io->dtype, err)))
            return s;
        int64_t t;
        snprintf(w2, sizeof w2, "%s tensor", what);
        if ((s = get_int(mp_get(r, "tensor"), w2, 0, (int64_t)ntensors, &t, err)))
            return s;
        io->tensor = (uint32_t)t;
        if (!p->sym && mlc_nbytes(io->shape, io->ndim, io->dtype, &io->nbytes))
            return bad(err, what, "is too large");
    }
    return MLC_OK;
}

static mlc_status parse_plan(mlc_model *m, const mp_node *obj, const char *what, int64_t batch,
                             mlc_plan *p, mlc_error *err)
{
    char at[64], w[200];
    mlc_status s;
    snprintf(at, sizeof at, "%s%s", what, what[0] ? ": " : "");
    p->batch = batch;
    const mp_node *symrec = mp_get(obj, "symbolic");
    if (symrec && symrec->type != MP_NIL && (s = mlc_sym_parse(m, symrec, p, err)))
        return s;
    const mp_node *tensors = mp_get(obj, "tensors");
    snprintf(w, sizeof w, "%stensors", at);
    if ((s = get_list(tensors, w, 0, err)))
        return s;
    p->ntensors = tensors->len;
    p->tensors = mlc_zalloc(&m->alloc, (tensors->len + 1) * sizeof(mlc_trow));
    if (!p->tensors)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    /* format 1.9: STORE rows (symbolic plans whose vm record says "stores") */
    const mp_node *vmrec = mp_get(obj, "vm");
    const mp_node *stores = vmrec && vmrec->type == MP_MAP ? mp_get(vmrec, "stores") : NULL;
    if (stores) {
        if (!in_range(stores, 0, INT64_MAX)) {
            snprintf(w, sizeof w, "%svm stores", at);
            return bad(err, w, "is not an integer");
        }
        p->has_stores = 1;
        p->nstores_declared = stores->v.i;
    }
    /* format 1.10: the STORE rows of carried values that grow (checked in loops.c) */
    const mp_node *grows = vmrec && vmrec->type == MP_MAP ? mp_get(vmrec, "grows") : NULL;
    if (grows) {
        snprintf(w, sizeof w, "%svm grows", at);
        if (grows->type != MP_ARRAY)
            return bad(err, w, "is not an array");
        for (uint32_t i = 0; i < grows->len; i++)
            if (!in_range(&grows->v.items[i], 0, (int64_t)tensors->len))
                return bad(err, w, "names no tensor row");
        p->grows = grows;
    }
    for (uint32_t i = 0; i < tensors->len; i++) {
        const mp_node *r = &tensors->v.items[i];
        mlc_trow *t = &p->tensors[i];
        snprintf(w, sizeof w, "%stensor %u", at, i);
        if (r->type != MP_ARRAY || r->len != 4)
            return bad(err, w, "is malformed");
        int64_t kind, ref;
        char w2[220];
        snprintf(w2, sizeof w2, "%s kind", w);
        if ((s = get_int(&r->v.items[0], w2, 0, p->sym ? (p->has_stores ? 4 : 3) : 2, &kind,
                         err)))
            return s;
        snprintf(w2, sizeof w2, "%s offset", w);
        if ((s = get_int(&r->v.items[1], w2, 0,
                         kind == T_CONST ? (int64_t)m->nconstants : MAX_DIM, &ref, err)))
            return s;
        t->kind = (int)kind;
        t->ref = (uint64_t)ref;
        if (p->sym) {
            t->rec = &r->v.items[2];
            if ((s = sym_shape(p, t->rec, w, err)))
                return s;
            t->ndim = (int)t->rec->len;
        } else if ((s = get_shape(&r->v.items[2], w, &t->ndim, t->shape, err))) {
            return s;
        }
        if ((s = get_dtype(&r->v.items[3], w, &t->dtype, err)))
            return s;
        if (!p->sym && mlc_nbytes(t->shape, t->ndim, t->dtype, &t->nbytes))
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: tensor %u lies outside its "
                            "storage", i);
    }
    if ((s = parse_io(m, p, mp_get(obj, "inputs"), at, "inputs", p->ntensors, &p->inputs,
                      &p->ninputs, err)))
        return s;
    if ((s = parse_io(m, p, mp_get(obj, "outputs"), at, "outputs", p->ntensors, &p->outputs,
                      &p->noutputs, err)))
        return s;
    const mp_node *kernels = mp_get(obj, "kernels");
    snprintf(w, sizeof w, "%skernels", at);
    if ((s = get_list(kernels, w, 0, err)))
        return s;
    p->nkernels = kernels->len;
    p->kernels = mlc_zalloc(&m->alloc, (kernels->len + 1) * sizeof(mlc_krow));
    if (!p->kernels)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < kernels->len; i++) {
        const mp_node *k = &kernels->v.items[i];
        mlc_krow *kr = &p->kernels[i];
        char w2[220];
        snprintf(w, sizeof w, "%skernel %u", at, i);
        if ((s = get_map(k, w, err)))
            return s;
        const mp_node *par = mp_get(k, "parallel"), *sym = mp_get(k, "symbolic");
        if ((par && par->type != MP_NIL && par->type != MP_BOOL)
            || (sym && sym->type != MP_NIL && sym->type != MP_BOOL))
            return bad(err, w, "has a flag that is not a boolean");
        kr->symbolic = sym && sym->type == MP_BOOL && sym->v.i;
        if (kr->symbolic && !p->sym)
            return bad(err, w, "is symbolic in a static plan");
        kr->parallel = par && par->type == MP_BOOL && par->v.i;
        const mp_node *wsr = mp_get(k, "workspace");
        if (wsr && wsr->type != MP_NIL) {
            if (!p->sym)
                return bad(err, w, "has a symbolic workspace in a static plan");
            if ((s = mlc_sym_dim(p, wsr, w, err)))
                return s;
            kr->workspace_rec = wsr;
        }
        snprintf(w2, sizeof w2, "%s name", w);
        if ((s = get_str(m, mp_get(k, "name"), w2, &kr->name, err)))
            return s;
        snprintf(w2, sizeof w2, "%s symbol", w);
        if ((s = get_str(m, mp_get(k, "symbol"), w2, &kr->symbol, err)))
            return s;
        int64_t v;
        snprintf(w2, sizeof w2, "%s num_inputs", w);
        if ((s = get_int(mp_get(k, "num_inputs"), w2, 0, 1 << 16, &v, err)))
            return s;
        kr->nin = (uint32_t)v;
        snprintf(w2, sizeof w2, "%s num_outputs", w);
        if ((s = get_int(mp_get(k, "num_outputs"), w2, 0, 1 << 16, &v, err)))
            return s;
        kr->nout = (uint32_t)v;
        snprintf(w2, sizeof w2, "%s workspace_bytes", w);
        if ((s = get_int(mp_get(k, "workspace_bytes"), w2, 0, MAX_DIM, &v, err)))
            return s;
        kr->workspace = (uint64_t)v;
        const mp_node *macs = mp_get(k, "macs");
        if (macs && macs->type != MP_NIL && !in_range(macs, 0, INT64_MAX)) {
            snprintf(w2, sizeof w2, "%s macs", w);
            return bad(err, w2, "is not an integer");
        }
        kr->macs = macs && macs->type != MP_NIL ? macs->v.i : -1;
    }
    const mp_node *code = mp_get(obj, "code");
    snprintf(w, sizeof w, "%scode", at);
    if ((s = get_list(code, w, 1, err)))
        return s;
    p->ncode = code->len;
    p->code = mlc_zalloc(&m->alloc, code->len * sizeof(mlc_variant));
    if (!p->code)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < code->len; i++) {
        const mp_node *v = &code->v.items[i];
        mlc_variant *cv = &p->code[i];
        char w2[220];
        snprintf(w, sizeof w, "%scode variant %u", at, i);
        if ((s = get_map(v, w, err)))
            return s;
        snprintf(w2, sizeof w2, "%s object", w);
        if ((s = get_ref(m, mp_get(v, "object"), w2, &cv->object, err)))
            return s;
        const mp_node *f = mp_get(v, "features");
        if (f && f->type != MP_NIL) {
            snprintf(w2, sizeof w2, "%s features", w);
            if ((s = get_list(f, w2, 0, err)))
                return s;
            cv->nfeatures = f->len;
            cv->features = mlc_zalloc(&m->alloc, (f->len + 1) * sizeof(char *));
            if (!cv->features)
                return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
            for (uint32_t j = 0; j < f->len; j++) {
                char *str;
                if ((s = get_str(m, &f->v.items[j], w2, &str, err)))
                    return s;
                cv->features[j] = str;
            }
        }
        const mp_node *ex = mp_get(v, "externals");
        if (ex && ex->type != MP_NIL) {
            snprintf(w2, sizeof w2, "%s externals", w);
            if ((s = get_list(ex, w2, 0, err)))
                return s;
            for (uint32_t j = 0; j < ex->len; j++)
                if (ex->v.items[j].type != MP_STR)
                    return bad(err, w2, "is not a string");
        }
        const mp_node *sizes = mp_get(v, "code_sizes");
        if (sizes && sizes->type != MP_NIL) {
            snprintf(w2, sizeof w2, "%s code_sizes", w);
            if ((s = get_map(sizes, w2, err)))
                return s;
            for (uint32_t j = 0; j < sizes->len; j++)
                if (sizes->v.items[2 * j].type != MP_STR
                    || !in_range(&sizes->v.items[2 * j + 1], 0, INT64_MAX))
                    return bad(err, w2, "is not a map of names to sizes");
        }
        static const char *const text[] = {"triple", "cpu", "llvm_features"};
        for (int j = 0; j < 3; j++) {
            const mp_node *tx = mp_get(v, text[j]);
            if (tx && tx->type != MP_NIL && tx->type != MP_STR)
                return bad(err, w, "has a target field that is not a string");
        }
        snprintf(w2, sizeof w2, "%s arch", w);
        if ((s = get_str(m, mp_get(v, "arch"), w2, &cv->arch, err)))
            return s;
        snprintf(w2, sizeof w2, "%s level", w);
        if ((s = get_str(m, mp_get(v, "level"), w2, &cv->level, err)))
            return s;
    }
    const mp_node *calls = mp_get(obj, "library_calls");
    if (calls && calls->type != MP_NIL) {
        snprintf(w, sizeof w, "%slibrary_calls", at);
        if ((s = get_list(calls, w, 0, err)))
            return s;
        p->nsites = calls->len;
        p->sites = mlc_zalloc(&m->alloc, (calls->len + 1) * sizeof(mlc_site));
        if (!p->sites)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (uint32_t i = 0; i < calls->len; i++) {
            const mp_node *c = &calls->v.items[i];
            char w2[220];
            snprintf(w, sizeof w, "%slibrary call %u", at, i);
            if ((s = get_map(c, w, err)))
                return s;
            snprintf(w2, sizeof w2, "%s func", w);
            if ((s = get_str(m, mp_get(c, "func"), w2, &p->sites[i].func, err)))
                return s;
            const mp_node *attrs = mp_get(c, "attrs");
            if (attrs && attrs->type != MP_NIL) {
                snprintf(w2, sizeof w2, "%s attrs", w);
                if ((s = get_map(attrs, w2, err)))
                    return s;
                p->sites[i].attrs.map = attrs;
            }
        }
    }
    const mp_node *vm = mp_get(obj, "vm");
    snprintf(w, sizeof w, "%svm", at);
    if ((s = get_map(vm, w, err)))
        return s;
    snprintf(w, sizeof w, "%sbytecode", at);
    if ((s = get_ref(m, mp_get(vm, "bytecode"), w, &p->bytecode, err)))
        return s;
    const mp_node *ins = mp_get(vm, "instructions");
    if (ins && ins->type != MP_NIL && !in_range(ins, 0, INT64_MAX)) {
        snprintf(w, sizeof w, "%svm instructions", at);
        return bad(err, w, "is not an integer");
    }
    const mp_node *mp = mp_get(obj, "memory_plan");
    const mp_node *arena = mp_get(mp, "arena_bytes");
    if (!mp || mp->type != MP_MAP || !in_range(arena, 0, MAX_DIM)) {
        snprintf(w, sizeof w, "%smemory plan", at);
        return bad(err, w, "has no valid arena size");
    }
    const mp_node *inter = mp_get(mp, "intermediate_bytes");
    if (inter && inter->type != MP_NIL && !in_range(inter, 0, INT64_MAX)) {
        snprintf(w, sizeof w, "%smemory plan intermediate_bytes", at);
        return bad(err, w, "is not an integer");
    }
    p->arena_bytes = (uint64_t)arena->v.i;
    return MLC_OK;
}

typedef struct {
    mlc_ref ref;
    const char *what;
} named_ref;

static int by_offset(const void *a, const void *b)
{
    const named_ref *x = a, *y = b;
    if (x->ref.off != y->ref.off)
        return x->ref.off < y->ref.off ? -1 : 1;
    return x->ref.size < y->ref.size ? -1 : x->ref.size > y->ref.size;
}

static mlc_status check_disjoint(mlc_model *m, mlc_error *err)
{
    size_t n = 3 * m->nconstants + m->ngolden_in + m->ngolden_out + 1;
    for (size_t p = 0; p < m->nplans; p++)
        n += m->plans[p].ncode + 1;
    for (size_t p = 0; p < m->nspecialized; p++)
        n += m->specialized[p].ncode + 1;
    named_ref *refs = calloc(n, sizeof *refs);
    if (!refs)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < m->nconstants; i++)
        refs[k++] = (named_ref){m->constants[i], "a constant"};
    for (size_t i = 0; i < 2 * m->nconstants; i++)
        if (m->stored_params[i].size)
            refs[k++] = (named_ref){m->stored_params[i], "a constant's scale or zero point"};
    for (size_t p = 0; p < m->nplans; p++) {
        for (size_t i = 0; i < m->plans[p].ncode; i++)
            refs[k++] = (named_ref){m->plans[p].code[i].object, "a code object"};
        refs[k++] = (named_ref){m->plans[p].bytecode, "the bytecode"};
    }
    for (size_t p = 0; p < m->nspecialized; p++) {
        for (size_t i = 0; i < m->specialized[p].ncode; i++)
            refs[k++] = (named_ref){m->specialized[p].code[i].object, "a code object"};
        refs[k++] = (named_ref){m->specialized[p].bytecode, "the bytecode"};
    }
    for (size_t i = 0; i < m->ngolden_in; i++)
        refs[k++] = (named_ref){m->golden_in[i].data, "a golden input"};
    for (size_t i = 0; i < m->ngolden_out; i++)
        refs[k++] = (named_ref){m->golden_out[i].data, "a golden output"};
    mlc_ref ir;
    const mp_node *irn = mp_get(m->header, "ir");
    if (irn && irn->type != MP_NIL) {
        mlc_status s = get_ref(m, irn, "IR text", &ir, err);
        if (s) {
            free(refs);
            return s;
        }
        refs[k++] = (named_ref){ir, "the IR text"};
    }
    size_t live = 0;
    for (size_t i = 0; i < k; i++)
        if (refs[i].ref.size)
            refs[live++] = refs[i];
    qsort(refs, live, sizeof *refs, by_offset);
    mlc_status s = MLC_OK;
    for (size_t i = 1; i < live && !s; i++) {
        const named_ref *a = &refs[i - 1], *b = &refs[i];
        if (b->ref.off < a->ref.off + a->ref.size
            && !(a->ref.off == b->ref.off && a->ref.size == b->ref.size))
            s = mlc_fail(err, MLC_ERR_BUNDLE, "%s: the payloads of %s and %s overlap; the "
                         "bundle is malformed: export it again", m->name, a->what, b->what);
    }
    free(refs);
    return s;
}

static mlc_status parse_golden(mlc_model *m, mlc_error *err)
{
    const mp_node *g = mp_get(m->header, "golden");
    mlc_status s;
    if (!g || g->type == MP_NIL)
        return MLC_OK;
    if ((s = get_map(g, "golden record", err)))
        return s;
    for (int kind = 0; kind < 2; kind++) {
        const char *key = kind ? "outputs" : "inputs";
        const mp_node *rows = mp_get(g, key);
        char w[64];
        snprintf(w, sizeof w, "golden %s", key);
        if ((s = get_list(rows, w, 0, err)))
            return s;
        mlc_golden_row *out = mlc_zalloc(&m->alloc, (rows->len + 1) * sizeof(mlc_golden_row));
        if (!out)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (uint32_t i = 0; i < rows->len; i++) {
            const mp_node *r = &rows->v.items[i];
            mlc_golden_row *row = &out[i];
            char w2[96];
            snprintf(w, sizeof w, "golden %s %u", kind ? "output" : "input", i);
            if ((s = get_map(r, w, err)))
                return s;
            snprintf(w2, sizeof w2, "%s name", w);
            if ((s = get_str(m, mp_get(r, "name"), w2, &row->name, err)))
                return s;
            if ((s = get_shape(mp_get(r, "shape"), w, &row->ndim, row->shape, err)))
                return s;
            if ((s = get_dtype(mp_get(r, "dtype"), w, &row->dtype, err)))
                return s;
            if ((s = get_ref(m, mp_get(r, "data"), w, &row->data, err)))
                return s;
            /* its size against its shape: checked by mlc_verify, as the Python runtime checks
             * it when the pair is read (a damaged pair does not stop inference) */
            static const char *const opt[] = {"magnitude", "quant_step"};
            for (int j = 0; j < 2; j++) {
                const mp_node *v = mp_get(r, opt[j]);
                double x = -1;
                if (v && v->type == MP_FLOAT)
                    x = v->v.f;
                else if (mp_is_int(v))
                    x = (double)v->v.i;
                if (!(x >= 0 && x <= 1.7976931348623157e308))   /* NaN, inf, negative: absent */
                    x = -1;
                if (j == 0)
                    row->magnitude = x;
                else
                    row->quant_step = x;
            }
        }
        if (kind) {
            m->golden_out = out;
            m->ngolden_out = rows->len;
        } else {
            m->golden_in = out;
            m->ngolden_in = rows->len;
        }
    }
    double tol[2];
    static const char *const keys[] = {"rtol", "atol"};
    for (int j = 0; j < 2; j++) {
        const mp_node *v = mp_get(g, keys[j]);
        double x = v && v->type == MP_FLOAT ? v->v.f : mp_is_int(v) ? (double)v->v.i : -1;
        if (!(x >= 0 && x < 1e6)) {
            char w[32];
            snprintf(w, sizeof w, "golden %s", keys[j]);
            return bad(err, w, "is not a valid tolerance");
        }
        tol[j] = x;
    }
    m->rtol = tol[0];
    m->atol = tol[1];
    m->has_golden = 1;
    return MLC_OK;
}

/* The batch plans: every plan the same inputs and outputs, batched ones with the batch first
 * (runtime/header.check_batch). */
static mlc_status parse_batch(mlc_model *m, mlc_error *err)
{
    const mp_node *h = m->header, *rows = mp_get(h, "plans"), *rec = mp_get(h, "batch");
    mlc_status s;
    if (!rows && !rec)
        return MLC_OK;
    if (!rows || rows->type != MP_ARRAY || rows->len == 0 || rows->len > MAX_PLANS || !rec
        || rec->type != MP_MAP)
        return bad(err, "plans/batch", "are malformed");
    const mp_node *sizes = mp_get(rec, "sizes"), *bin = mp_get(rec, "inputs"),
                  *bout = mp_get(rec, "outputs");
    if (!sizes || sizes->type != MP_ARRAY || sizes->len != rows->len)
        return bad(err, "plan batch sizes", "are malformed");
    for (uint32_t i = 0; i < rows->len; i++) {
        const mp_node *b = mp_get(&rows->v.items[i], "batch");
        if (!in_range(b, 1, 1LL << 31) || !mp_is_int(&sizes->v.items[i])
            || sizes->v.items[i].v.i != b->v.i
            || (i && b->v.i <= mp_get(&rows->v.items[i - 1], "batch")->v.i))
            return bad(err, "plan batch sizes", "are malformed");
    }
    if (!bin || bin->type != MP_ARRAY || !bin->len || !bout || bout->type != MP_ARRAY)
        return bad(err, "batched inputs/outputs", "are malformed");
    for (uint32_t i = 0; i < bin->len; i++)
        if (bin->v.items[i].type != MP_STR)
            return bad(err, "batched inputs/outputs", "are malformed");
    for (uint32_t i = 0; i < bout->len; i++)
        if (bout->v.items[i].type != MP_STR)
            return bad(err, "batched inputs/outputs", "are malformed");
    m->nplans = rows->len;
    m->plans = mlc_zalloc(&m->alloc, rows->len * sizeof(mlc_plan));
    if (!m->plans)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < rows->len; i++) {
        char what[32];
        snprintf(what, sizeof what, "plan %u", i);
        if ((s = get_map(&rows->v.items[i], what, err)))
            return s;
        if ((s = parse_plan(m, &rows->v.items[i], what,
                            mp_get(&rows->v.items[i], "batch")->v.i, &m->plans[i], err)))
            return s;
    }
    const mlc_plan *ref = &m->plans[0];
    for (size_t p = 0; p < m->nplans; p++) {
        mlc_plan *plan = &m->plans[p];
        for (int kind = 0; kind < 2; kind++) {
            size_t n = kind ? plan->noutputs : plan->ninputs;
            size_t nref = kind ? ref->noutputs : ref->ninputs;
            const mp_node *names = kind ? bout : bin;
            if (n != nref)
                return bad(err, kind ? "the plans' outputs" : "the plans' inputs", "differ");
            for (size_t i = 0; i < n; i++) {
                mlc_iorow *s1 = kind ? &plan->outputs[i] : &plan->inputs[i];
                const mlc_iorow *r = kind ? &ref->outputs[i] : &ref->inputs[i];
                if (strcmp(s1->name, r->name) || s1->dtype != r->dtype || s1->ndim != r->ndim)
                    return bad(err, kind ? "the plans' outputs" : "the plans' inputs", "differ");
                int batched = 0;
                for (uint32_t j = 0; j < names->len; j++)
                    if (mp_str_eq(&names->v.items[j], s1->name))
                        batched = 1;
                s1->batched = batched;
                if (batched || kind) {
                    if (!batched || !s1->ndim || s1->shape[0] != plan->batch
                        || memcmp(s1->shape + 1, r->shape + 1, (size_t)(s1->ndim - 1) * 8))
                        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s '%s' of the "
                                        "batch-%lld plan does not have the batch first",
                                        kind ? "output" : "input", s1->name,
                                        (long long)plan->batch);
                } else if (memcmp(s1->shape, r->shape, (size_t)s1->ndim * 8)) {
                    return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: input '%s' differs "
                                    "between plans", s1->name);
                }
            }
        }
    }
    for (uint32_t j = 0; j < bin->len; j++) {
        int found = 0;
        for (size_t i = 0; i < ref->ninputs; i++)
            found |= mp_str_eq(&bin->v.items[j], ref->inputs[i].name);
        if (!found)
            return bad(err, "batched inputs", "name no input");
    }
    m->batched = 1;
    return MLC_OK;
}

/* A float32 constant stored as 8-bit integers (format 1.5, docs/format.md StoredRecord):
 * value = (float32(q) - zero_point) * scale, scale and zero point broadcast along the dims where
 * param_shape is 1; expanded once here into memory the model owns. */
static mlc_status stored_constant(mlc_model *m, const mp_node *st, const char *w, uint32_t i,
                                  int ndim, const int64_t *shape, mlc_error *err)
{
    char what[64];
    snprintf(what, sizeof what, "%s stored", w);
    mlc_status s;
    if ((s = get_map(st, what, err)))
        return s;
    int is_u8 = mp_str_eq(mp_get(st, "dtype"), "uint8");
    if ((!is_u8 && !mp_str_eq(mp_get(st, "dtype"), "int8"))
        || m->constant_dtypes[i] != MLC_FLOAT32)
        return bad(err, what, "must store int8 or uint8 for a float32 constant");
    int pdim;
    int64_t params[MLC_MAX_DIMS];
    char pw[80];
    snprintf(pw, sizeof pw, "%s param_shape", what);
    if ((s = get_shape(mp_get(st, "param_shape"), pw, &pdim, params, err)))
        return s;
    uint64_t count = 1, pcount = 1;
    if (pdim != ndim)
        return bad(err, what, "has a param_shape of another rank");
    for (int d = 0; d < ndim; d++) {
        if (params[d] != 1 && params[d] != shape[d])
            return bad(err, what, "has a param_shape that does not broadcast");
        if (shape[d] && count > UINT64_MAX / 4 / (uint64_t)shape[d])
            return bad(err, what, "is too large");
        count *= (uint64_t)shape[d];
        pcount *= (uint64_t)params[d];
    }
    if (count != m->constants[i].size)
        return bad(err, what, "has a payload size that does not match its shape");
    mlc_ref *refs = &m->stored_params[2 * i];
    const char *keys[2] = {"scale", "zero_point"};
    for (int k = 0; k < 2; k++) {
        snprintf(pw, sizeof pw, "%s %s", what, keys[k]);
        if ((s = get_ref(m, mp_get(st, keys[k]), pw, &refs[k], err)))
            return s;
        if (refs[k].size != pcount * 4)
            return bad(err, pw, "has a size that does not match param_shape");
    }
    uint8_t *raw = mlc_zalloc(&m->alloc, count * 4 + 64);
    if (!raw)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    float *out = (float *)(void *)(raw + (-(uintptr_t)raw & 63));
    const uint8_t *base = m->data + m->data_start;
    const uint8_t *q = base + m->constants[i].off;
    const uint8_t *sc = base + refs[0].off, *zp = base + refs[1].off;
    /* strides of the parameter arrays (0 along broadcast dims), then one pass in C order */
    uint64_t pstride[MLC_MAX_DIMS], idx[MLC_MAX_DIMS] = {0};
    uint64_t acc = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        pstride[d] = params[d] == 1 ? 0 : acc;
        acc *= (uint64_t)params[d];
    }
    uint64_t at = 0;
    for (uint64_t e = 0; e < count; e++) {
        float sv, zv;
        memcpy(&sv, sc + 4 * at, 4);
        memcpy(&zv, zp + 4 * at, 4);
        float qv = is_u8 ? (float)q[e] : (float)(int8_t)q[e];
        out[e] = (qv - zv) * sv;
        for (int d = ndim - 1; d >= 0; d--) {   /* next index, parameter offset kept */
            at += pstride[d];
            if ((int64_t)++idx[d] < shape[d])
                break;
            at -= pstride[d] * idx[d];
            idx[d] = 0;
        }
    }
    m->constant_addr[i] = (const uint8_t *)out;
    m->constant_bytes[i] = count * 4;
    return MLC_OK;
}

mlc_status mlc_parse_header(mlc_model *m, mlc_error *err)
{
    const mp_node *h = m->header;
    mlc_status s;
    const mp_node *mr = mp_get(h, "min_reader");
    if (mr && !is_version(mr))
        return bad(err, "min_reader", "is not a [major, minor] version");
    const mp_node *consts = mp_get(h, "constants");
    if ((s = get_list(consts, "constants", 0, err)))
        return s;
    m->nconstants = consts->len;
    m->constants = mlc_zalloc(&m->alloc, (consts->len + 1) * sizeof(mlc_ref));
    m->constant_dtypes = mlc_zalloc(&m->alloc, (consts->len + 1) * sizeof(mlc_dtype));
    m->constant_addr = mlc_zalloc(&m->alloc, (consts->len + 1) * sizeof(uint8_t *));
    m->constant_bytes = mlc_zalloc(&m->alloc, (consts->len + 1) * sizeof(uint64_t));
    m->stored_params = mlc_zalloc(&m->alloc, 2 * (consts->len + 1) * sizeof(mlc_ref));
    if (!m->constants || !m->constant_dtypes || !m->constant_addr || !m->constant_bytes
        || !m->stored_params)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < consts->len; i++) {
        const mp_node *c = &consts->v.items[i];
        char w[48];
        int ndim;
        int64_t shape[MLC_MAX_DIMS];
        uint64_t nb;
        snprintf(w, sizeof w, "constant %u", i);
        if ((s = get_map(c, w, err)) || (s = get_shape(mp_get(c, "shape"), w, &ndim, shape, err))
            || (s = get_dtype(mp_get(c, "dtype"), w, &m->constant_dtypes[i], err))
            || (s = get_ref(m, mp_get(c, "data"), w, &m->constants[i], err)))
            return s;
        const mp_node *st = mp_get(c, "stored");
        if (st && st->type != MP_NIL) {
            if ((s = stored_constant(m, st, w, i, ndim, shape, err)))
                return s;
            continue;
        }
        if (mlc_nbytes(shape, ndim, m->constant_dtypes[i], &nb) || nb != m->constants[i].size)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: payload size %llu does not match %s's "
                            "shape and dtype", m->name, (unsigned long long)m->constants[i].size,
                            w);
        m->constant_addr[i] = m->data + m->data_start + m->constants[i].off;
        m->constant_bytes[i] = nb;
    }
    const mp_node *labels = mp_get(h, "labels");
    if (labels && labels->type != MP_NIL && labels->type != MP_ARRAY)
        return bad(err, "labels", "must be a list");
    const mp_node *pre = mp_get(h, "preprocess");
    if (pre && pre->type != MP_NIL && pre->type != MP_MAP)
        return bad(err, "preprocess", "is not a map");
    const mp_node *pad = mp_get(h, "pad");
    if (pad && pad->type != MP_NIL && pad->type != MP_BIN)
        return bad(err, "pad", "is not bytes");
    mlc_plan top;
    memset(&top, 0, sizeof top);
    if ((s = parse_plan(m, h, "", 0, &top, err)))
        return s;
    if (top.sym && (mp_get(h, "plans") || mp_get(h, "batch")))
        return bad(err, "plans", "cannot go with symbolic shapes");
    if ((s = parse_batch(m, err)))
        return s;
    const mp_node *spec = mp_get(h, "specialized");
    if (spec && spec->type != MP_NIL) {
        if (!top.sym)
            return bad(err, "specialized plans", "go with a symbolic plan only");
        if (spec->type != MP_ARRAY || !spec->len || spec->len > MAX_PLANS)
            return bad(err, "specialized plans", "are malformed");
        m->nspecialized = spec->len;
        m->specialized = mlc_zalloc(&m->alloc, spec->len * sizeof(mlc_plan));
        if (!m->specialized)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (uint32_t i = 0; i < spec->len; i++) {
            const mp_node *row = &spec->v.items[i];
            const mp_node *b = mp_get(row, "batch");
            char what[48];
            snprintf(what, sizeof what, "specialized plan %u", i);
            if (row->type != MP_MAP || !in_range(b, 1, 1LL << 31))
                return bad(err, what, "batch is malformed");
            mlc_plan *sp = &m->specialized[i];
            if ((s = parse_plan(m, row, what, b->v.i, sp, err)))
                return s;
            if (sp->sym)
                return bad(err, what, "must be static");
            if (sp->ninputs != top.ninputs || sp->noutputs != top.noutputs)
                return bad(err, what, "differs from the symbolic plan's inputs and outputs");
            for (int kind = 0; kind < 2; kind++)
                for (size_t j = 0; j < (kind ? sp->noutputs : sp->ninputs); j++) {
                    const mlc_iorow *a = kind ? &sp->outputs[j] : &sp->inputs[j];
                    const mlc_iorow *c = kind ? &top.outputs[j] : &top.inputs[j];
                    if (strcmp(a->name, c->name) || a->dtype != c->dtype || a->ndim != c->ndim)
                        return bad(err, what, "differs from the symbolic plan's inputs and "
                                   "outputs");
                }
        }
    }
    if (!m->plans) {
        m->plans = mlc_zalloc(&m->alloc, sizeof(mlc_plan));
        if (!m->plans)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        m->plans[0] = top;
        m->nplans = 1;
    } else {
        /* the top level is a copy of the largest plan, for readers of format 1.0 */
        const mlc_plan *last = &m->plans[m->nplans - 1];
        if (top.ntensors != last->ntensors || top.nkernels != last->nkernels
            || top.ncode != last->ncode || top.bytecode.off != last->bytecode.off
            || top.arena_bytes != last->arena_bytes)
            return bad(err, "top-level plan", "differs from the largest batch plan");
    }
    if ((s = parse_golden(m, err)))
        return s;
    return check_disjoint(m, err);
}

