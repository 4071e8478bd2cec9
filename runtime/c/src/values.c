/* Size variables bound from inputs' values (format 1.6, docs/format.md section 10.8;
 * runtime/values.py): the symbolic record's "values" rows, applied after the inputs' dims are
 * bound and before any shape is evaluated. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model.h"

#define MAX_DIM (1LL << 40)

/* The values of the integer input named `n` (int32 or int64, at most 64), *count set; or an
 * error naming it. */
static mlc_status read_ints(const mlc_plan *p, const mlc_tensor *in, const mp_node *n,
                            int64_t *out, uint32_t *count, mlc_error *err)
{
    size_t i = 0;
    while (i < p->ninputs && !mp_str_eq(n, p->inputs[i].name))
        i++;
    if (i == p->ninputs || !(p->inputs[i].dtype == MLC_INT32 || p->inputs[i].dtype == MLC_INT64))
        return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: a symbolic values row does not "
                        "name an integer input");
    const mlc_tensor *t = &in[i];
    if (t->dtype != p->inputs[i].dtype || t->ndim < 0 || t->ndim > MLC_MAX_DIMS)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has dtype %s; the model takes %s",
                        p->inputs[i].name, mlc_dtype_name(t->dtype),
                        mlc_dtype_name(p->inputs[i].dtype));
    uint64_t c = 1;
    for (int a = 0; a < t->ndim; a++)
        c *= (uint64_t)t->dims[a];
    size_t esize = t->dtype == MLC_INT32 ? 4 : 8;
    if (c > 64 || !t->data || t->nbytes < c * esize)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' holds %llu values; the model reads at "
                        "most 64", p->inputs[i].name, (unsigned long long)c);
    for (uint64_t k = 0; k < c; k++)
        out[k] = esize == 4 ? (int64_t)((const int32_t *)t->data)[k]
                            : ((const int64_t *)t->data)[k];
    *count = (uint32_t)c;
    return MLC_OK;
}

/* A "slice" row's sizes (runtime/symbolic.py _slice_sizes): per axis of data of dims src, the
 * output size, the first index + 1, and the step as p, q (step = p - q), clamped as ONNX
 * Slice clamps starts and ends; written to out (4 per axis). */
static mlc_status slice_sizes(const mlc_plan *p, const mlc_tensor *in, const mp_node *row,
                              const char *name, const int64_t *starts, uint32_t k,
                              const int64_t *src, uint32_t rank, int64_t *out, mlc_error *err)
{
    int64_t ends[64], axes[64], steps[64];
    uint32_t ne = 0, na = k, ns = k;
    mlc_status st = read_ints(p, in, &row->v.items[4], ends, &ne, err);
    if (!st && row->v.items[5].len)
        st = read_ints(p, in, &row->v.items[5], axes, &na, err);
    else
        for (uint32_t j = 0; j < k; j++)
            axes[j] = j;
    if (!st && row->v.items[6].len)
        st = read_ints(p, in, &row->v.items[6], steps, &ns, err);
    else
        for (uint32_t j = 0; j < k; j++)
            steps[j] = 1;
    if (st)
        return st;
    if (ne != k || na != k || ns != k)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s': starts, ends, axes and steps must have "
                        "the same length", name);
    uint8_t seen[MLC_MAX_DIMS] = {0};
    for (uint32_t a = 0; a < rank; a++) {
        out[4 * a] = src[a];
        out[4 * a + 1] = 1;
        out[4 * a + 2] = 2;
        out[4 * a + 3] = 1;
    }
    for (uint32_t j = 0; j < k; j++) {
        int64_t a = axes[j], s = starts[j], e = ends[j], step = steps[j], n;
        if (a < -(int64_t)rank || a >= (int64_t)rank)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': axis %lld is out of range for rank "
                            "%u", name, (long long)a, rank);
        a = a < 0 ? a + rank : a;
        if (seen[a])
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': an axis repeats", name);
        seen[a] = 1;
        if (step == 0 || step < -MAX_DIM || step > MAX_DIM)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': a step of %lld", name,
                            (long long)step);
        int64_t d = src[a];
        if (s < 0)
            s = s < -MAX_DIM ? -1 : s + d;
        if (e < 0)
            e = e < -MAX_DIM ? -1 : e + d;
        if (step > 0) {
            s = s < 0 ? 0 : s > d ? d : s;
            e = e < 0 ? 0 : e > d ? d : e;
            n = e > s ? (e - s + step - 1) / step : 0;
        } else {
            s = s < 0 ? 0 : s > d - 1 ? d - 1 : s;
            e = e < -1 ? -1 : e > d - 1 ? d - 1 : e;
            n = s > e ? (s - e - step - 1) / -step : 0;
        }
        if (n < 1)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': the slice of axis %lld is empty; the "
                            "model takes every size at least 1", name, (long long)a);
        out[4 * a] = n;
        out[4 * a + 1] = s + 1;
        out[4 * a + 2] = (step > 0 ? step : 0) + 1;
        out[4 * a + 3] = (step < 0 ? -step : 0) + 1;
    }
    return MLC_OK;
}

/* A "pad" row's sizes (runtime/symbolic.py _pad_sizes): per axis of data of dims src, the
 * output size and the leading pad as p, q (lead = p - q), written to out (3 per axis). */
static mlc_status pad_sizes(const mlc_plan *p, const mlc_tensor *in, const mp_node *row,
                            const char *name, const int64_t *pads, uint32_t npads,
                            const int64_t *src, uint32_t rank, int64_t *out, mlc_error *err)
{
    int64_t axes[64];
    uint32_t k = rank;
    if (row->v.items[4].len) {
        mlc_status st = read_ints(p, in, &row->v.items[4], axes, &k, err);
        if (st)
            return st;
    } else {
        for (uint32_t j = 0; j < rank; j++)
            axes[j] = j;
    }
    if (npads != 2 * k)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' holds %u pads for %u axes", name, npads, k);
    uint8_t seen[MLC_MAX_DIMS] = {0};
    for (uint32_t a = 0; a < rank; a++) {
        out[3 * a] = src[a];
        out[3 * a + 1] = 1;
        out[3 * a + 2] = 1;
    }
    for (uint32_t j = 0; j < k; j++) {
        int64_t a = axes[j], lead = pads[j], trail = pads[j + k];
        if (a < -(int64_t)rank || a >= (int64_t)rank)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': axis %lld is out of range for rank "
                            "%u", name, (long long)a, rank);
        a = a < 0 ? a + rank : a;
        if (seen[a])
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': an axis repeats", name);
        seen[a] = 1;
        if (lead <= -MAX_DIM || lead >= MAX_DIM || trail <= -MAX_DIM || trail >= MAX_DIM)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': a pad of %lld is too large", name,
                            (long long)(lead <= -MAX_DIM || lead >= MAX_DIM ? lead : trail));
        if (src[a] + lead + trail < 1)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': pads %lld, %lld leave axis %lld of "
                            "size %lld empty; the model takes every size at least 1", name,
                            (long long)lead, (long long)trail, (long long)a, (long long)src[a]);
        out[3 * a] = src[a] + lead + trail;
        out[3 * a + 1] = (lead > 0 ? lead : 0) + 1;
        out[3 * a + 2] = (lead < 0 ? -lead : 0) + 1;
    }
    return MLC_OK;
}

/* The sizes an "axes" row binds (runtime/symbolic.py _axes_sizes), written over vals: the
 * axes (each in [-rank, rank), distinct) over data of dims src, under mode 0 (a reduction's
 * dims, reduced ones 1), 1 (those, then the kept dims), 2 (an Unsqueeze's dims), 3 (a
 * Squeeze's; each squeezed dim must be 1) or 4 (axis + 1). */
static mlc_status axes_sizes(const char *name, int64_t *vals, uint32_t k, const int64_t *src,
                             uint32_t nsrc, int mode, uint32_t count, mlc_error *err)
{
    int64_t rank = mode == 2 ? (int64_t)nsrc + k : (int64_t)nsrc;
    uint8_t chosen[2 * MLC_MAX_DIMS + 64] = {0};
    int64_t out[64 + 2 * MLC_MAX_DIMS];
    uint32_t n = 0;
    if (rank > MLC_MAX_DIMS + 64)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s': too many axes", name);
    for (uint32_t i = 0; i < k; i++) {
        if (vals[i] < -rank || vals[i] >= rank)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': axis %lld is out of range for "
                            "rank %lld", name, (long long)vals[i], (long long)rank);
        int64_t a = vals[i] < 0 ? vals[i] + rank : vals[i];
        if (chosen[a])
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': an axis repeats", name);
        chosen[a] = 1;
    }
    if (mode == 4) {
        out[n++] = (vals[0] < 0 ? vals[0] + rank : vals[0]) + 1;
    } else if (mode == 2) {
        uint32_t next = 0;
        for (int64_t i = 0; i < rank; i++)
            out[n++] = chosen[i] ? 1 : src[next++];
    } else if (mode == 3) {
        for (int64_t i = 0; i < rank; i++) {
            if (chosen[i] && src[i] != 1)
                return mlc_fail(err, MLC_ERR_INPUT, "input '%s': axis %lld has size %lld, not 1, "
                                "so it cannot be squeezed", name, (long long)i, (long long)src[i]);
            if (!chosen[i])
                out[n++] = src[i];
        }
    } else {
        for (int64_t i = 0; i < rank; i++)
            out[n++] = chosen[i] ? 1 : src[i];
        for (int64_t i = 0; mode == 1 && i < rank; i++)
            if (!chosen[i])
                out[n++] = src[i];
    }
    if (n != count)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' holds %u axes; the model takes another "
                        "count", name, k);
    memcpy(vals, out, n * sizeof(int64_t));
    return MLC_OK;
}

/* A "scales" row (format 1.7, runtime/values.py _bind_scales): each variable
 * floor(scale * src dim), the product in double of the float32/float64 scale fed. */
static mlc_status scale_sizes(const mlc_model *m, const mlc_plan *p, const mlc_tensor *in,
                              const mp_node *row, size_t r, int64_t *env, int *bound_by,
                              mlc_error *err)
{
    const mp_node *vs = &row->v.items[2], *sr = &row->v.items[3];
    size_t i = 0;
    while (i < p->ninputs && !mp_str_eq(&row->v.items[0], p->inputs[i].name))
        i++;
    if (i == p->ninputs || !(p->inputs[i].dtype == MLC_FLOAT32 || p->inputs[i].dtype == MLC_FLOAT64))
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: symbolic scales row %zu "
                        "does not name a float input", m->name, r);
    const mlc_tensor *t = &in[i];
    const char *name = p->inputs[i].name;
    if (t->dtype != p->inputs[i].dtype || t->ndim < 0 || t->ndim > MLC_MAX_DIMS)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has dtype %s; the model takes %s",
                        name, mlc_dtype_name(t->dtype), mlc_dtype_name(p->inputs[i].dtype));
    uint64_t count = 1;
    for (int a = 0; a < t->ndim; a++)
        count *= (uint64_t)t->dims[a];
    size_t esize = t->dtype == MLC_FLOAT32 ? 4 : 8;
    if (count != vs->len || !t->data || t->nbytes < count * esize)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' holds %llu values; the model reads it "
                        "as %u float scales", name, (unsigned long long)count, vs->len);
    for (uint32_t k = 0; k < vs->len; k++) {
        int64_t src;
        if (mlc_sym_eval(p, &sr->v.items[k], env, &src) || src < 1)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: symbolic scales row %zu "
                            "reads sizes not bound yet", m->name, r);
        double scale = esize == 4 ? (double)((const float *)t->data)[k]
                                  : ((const double *)t->data)[k];
        double size = scale * (double)src;
        if (!(size >= 1.0) || size >= (double)MAX_DIM)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s': scale %g at index %u makes a size "
                            "of %g from %lld (every size at least 1)", name, scale, k, size,
                            (long long)src);
        int v = mlc_sym_var(p, &vs->v.items[k]);
        env[v] = (int64_t)floor(size);
        if (bound_by && v < 64)
            bound_by[v] = (int)i;
    }
    return MLC_OK;
}

mlc_status mlc_sym_values(const mlc_model *m, const mlc_plan *p, const mlc_tensor *in,
                          int64_t *env, int *bound_by, mlc_error *err)
{
    const mlc_symbolic *s = p->sym;
    for (size_t r = 0; r < s->nvalues; r++) {
        const mp_node *row = s->values[r], *vs = &row->v.items[2];
        const mp_node *rule = &row->v.items[1];
        if (mp_str_eq(rule, "scales")) {
            mlc_status st = scale_sizes(m, p, in, row, r, env, bound_by, err);
            if (st)
                return st;
            continue;
        }
        size_t i = 0;
        while (i < p->ninputs && !mp_str_eq(&row->v.items[0], p->inputs[i].name))
            i++;
        if (i == p->ninputs || !(p->inputs[i].dtype == MLC_INT32 || p->inputs[i].dtype == MLC_INT64))
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: symbolic values row %zu "
                            "does not name an integer input", m->name, r);
        const mlc_tensor *t = &in[i];
        const char *name = p->inputs[i].name;
        if (t->dtype != p->inputs[i].dtype || t->ndim < 0 || t->ndim > MLC_MAX_DIMS)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has dtype %s; the model takes %s",
                            name, mlc_dtype_name(t->dtype), mlc_dtype_name(p->inputs[i].dtype));
        uint64_t count = 1;
        for (int a = 0; a < t->ndim; a++)
            count *= (uint64_t)t->dims[a];
        size_t esize = t->dtype == MLC_INT32 ? 4 : 8;
        int axes = mp_str_eq(rule, "axes"), slice = mp_str_eq(rule, "slice");
        int pad = mp_str_eq(rule, "pad");
        if ((axes || slice || pad ? count > 64 : count != vs->len) || !t->data || t->nbytes < count * esize)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s' holds %llu values; the model reads "
                            "it as %u integer sizes", name, (unsigned long long)count, vs->len);
        int64_t vals[64], src[MLC_MAX_DIMS];
        for (uint32_t k = 0; k < count; k++)
            vals[k] = esize == 4 ? (int64_t)((const int32_t *)t->data)[k]
                                 : ((const int64_t *)t->data)[k];
        uint32_t nsrc = 0;
        if (row->len >= 4) {
            const mp_node *sr = &row->v.items[3];
            nsrc = sr->len;
            for (uint32_t k = 0; k < nsrc; k++)
                if (mlc_sym_eval(p, &sr->v.items[k], env, &src[k]) || src[k] < 1)
                    return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: symbolic values "
                                    "row %zu reads sizes not bound yet", m->name, r);
        }
        if (mp_str_eq(rule, "reshape")) {
            int allowzero = (int)row->v.items[4].v.i, neg = -1, ninfer = 0;
            int64_t known = 1, total = 1;
            for (uint32_t k = 0; k < vs->len; k++) {
                if (vals[k] == 0 && !allowzero && k < nsrc)
                    vals[k] = src[k];
                if (vals[k] == -1) {
                    neg = (int)k;
                    ninfer++;
                } else {
                    known *= vals[k];
                }
            }
            for (uint32_t k = 0; k < nsrc; k++)
                total *= src[k];
            if (ninfer == 1) {
                if (known <= 0 || total % known)
                    return mlc_fail(err, MLC_ERR_INPUT, "input '%s': a shape that cannot hold "
                                    "the %lld elements of the reshaped tensor", name,
                                    (long long)total);
                vals[neg] = total / known;
            }
        } else if (pad) {
            int64_t out[3 * MLC_MAX_DIMS];
            if (vs->len != 3 * nsrc)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: a pad row is malformed",
                                m->name);
            mlc_status st = pad_sizes(p, in, row, name, vals, (uint32_t)count, src, nsrc, out, err);
            if (st)
                return st;
            memcpy(vals, out, vs->len * sizeof(int64_t));
        } else if (slice) {
            int64_t out[4 * MLC_MAX_DIMS];
            if (vs->len != 4 * nsrc)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: a slice row is "
                                "malformed", m->name);
            mlc_status st = slice_sizes(p, in, row, name, vals, (uint32_t)count, src, nsrc, out,
                                        err);
            if (st)
                return st;
            memcpy(vals, out, vs->len * sizeof(int64_t));
        } else if (axes) {
            mlc_status st = axes_sizes(name, vals, (uint32_t)count, src, nsrc,
                                       (int)row->v.items[4].v.i, vs->len, err);
            if (st)
                return st;
        } else if (mp_str_eq(rule, "expand")) {
            int64_t lead = (int64_t)vs->len - (int64_t)nsrc;
            for (uint32_t k = 0; k < vs->len; k++)
                if (vals[k] == 1 && (int64_t)k >= lead && src[k - lead] != 1)
                    vals[k] = src[k - lead];
        }
        for (uint32_t k = 0; k < vs->len; k++) {
            if (vals[k] < 1 || vals[k] >= MAX_DIM)
                return mlc_fail(err, MLC_ERR_INPUT, "input '%s': the model reads it as sizes, "
                                "and %lld at index %u is not a size (every size at least 1)",
                                name, (long long)vals[k], k);
            int v = mlc_sym_var(p, &vs->v.items[k]);
            env[v] = vals[k];
            if (bound_by && v < 64)
                bound_by[v] = (int)i;
        }
    }
    return MLC_OK;
}
