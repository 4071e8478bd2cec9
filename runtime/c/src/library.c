/* The built-in library functions (runtime/library.py's env.*) for float32 tensors, and call
 * site attributes. numpy computes env.linear / env.matmul with BLAS and env.softmax with its own
 * vectorized exp, so these agree with the Python runtime to float32 rounding, not bit for bit
 * (kernels compiled into the bundle are bit-identical; library calls are the exception). */
#include <math.h>
#include <string.h>

#include "internal.h"

int64_t mlc_attr_int(const mlc_attrs *attrs, const char *name, int64_t fallback)
{
    const mp_node *v = attrs ? mp_get(attrs->map, name) : NULL;
    return mp_is_int(v) ? v->v.i : fallback;
}

double mlc_attr_float(const mlc_attrs *attrs, const char *name, double fallback)
{
    const mp_node *v = attrs ? mp_get(attrs->map, name) : NULL;
    if (v && v->type == MP_FLOAT)
        return v->v.f;
    return mp_is_int(v) ? (double)v->v.i : fallback;
}

static int64_t count(const mlc_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->dims[i];
    return n;
}

static int all_f32(const mlc_tensor *in, int n, const mlc_tensor *out)
{
    for (int i = 0; i < n; i++)
        if (in[i].dtype != MLC_FLOAT32)
            return 0;
    return out->dtype == MLC_FLOAT32;
}

static int lib_linear(void *user, const mlc_tensor *in, int nin, mlc_tensor *out,
                      const mlc_attrs *attrs)
{
    (void)user;
    (void)attrs;
    if ((nin != 2 && nin != 3) || !all_f32(in, nin, out) || in[0].ndim < 1 || in[1].ndim != 2)
        return 1;
    int64_t k = in[0].dims[in[0].ndim - 1], n = in[1].dims[0], rows = count(&in[0]) / (k ? k : 1);
    if (in[1].dims[1] != k || count(out) != rows * n || (nin == 3 && count(&in[2]) != n))
        return 1;
    const float *x = in[0].data, *w = in[1].data, *b = nin == 3 ? in[2].data : NULL;
    float *y = out->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < k; i++)
                acc += x[r * k + i] * w[j * k + i];
            y[r * n + j] = b ? acc + b[j] : acc;
        }
    return 0;
}

static int lib_relu(void *user, const mlc_tensor *in, int nin, mlc_tensor *out,
                    const mlc_attrs *attrs)
{
    (void)user;
    (void)attrs;
    if (nin != 1 || !all_f32(in, 1, out) || count(out) != count(&in[0]))
        return 1;
    const float *x = in[0].data;
    float *y = out->data;
    for (int64_t i = 0, n = count(out); i < n; i++)
        y[i] = (x[i] >= 0.0f || x[i] != x[i]) ? x[i] : 0.0f;   /* np.maximum(x, 0) */
    return 0;
}

static int lib_softmax(void *user, const mlc_tensor *in, int nin, mlc_tensor *out,
                       const mlc_attrs *attrs)
{
    (void)user;
    if (nin != 1 || !all_f32(in, 1, out) || count(out) != count(&in[0]) || in[0].ndim < 1)
        return 1;
    int64_t axis = mlc_attr_int(attrs, "axis", -1);
    if (axis < 0)
        axis += in[0].ndim;
    if (axis < 0 || axis >= in[0].ndim)
        return 1;
    int64_t outer = 1, len = in[0].dims[axis], inner = 1;
    for (int i = 0; i < axis; i++)
        outer *= in[0].dims[i];
    for (int i = (int)axis + 1; i < in[0].ndim; i++)
        inner *= in[0].dims[i];
    const float *x = in[0].data;
    float *y = out->data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const float *xs = x + o * len * inner + j;
            float *ys = y + o * len * inner + j;
            float m = -INFINITY, sum = 0.0f;
            for (int64_t i = 0; i < len; i++)
                m = xs[i * inner] > m ? xs[i * inner] : m;
            for (int64_t i = 0; i < len; i++) {
                ys[i * inner] = expf(xs[i * inner] - m);
                sum += ys[i * inner];
            }
            for (int64_t i = 0; i < len; i++)
                ys[i * inner] /= sum;
        }
    return 0;
}

static int lib_matmul(void *user, const mlc_tensor *in, int nin, mlc_tensor *out,
                      const mlc_attrs *attrs)
{
    (void)user;
    (void)attrs;
    if (nin != 2 || !all_f32(in, 2, out) || in[0].ndim < 2 || in[1].ndim < 2)
        return 1;
    int64_t m = in[0].dims[in[0].ndim - 2], k = in[0].dims[in[0].ndim - 1];
    int64_t n = in[1].dims[in[1].ndim - 1];
    if (in[1].dims[in[1].ndim - 2] != k)
        return 1;
    int64_t ba = count(&in[0]) / (m * k != 0 ? m * k : 1);
    int64_t bb = count(&in[1]) / (k * n != 0 ? k * n : 1);
    int64_t batch = ba > bb ? ba : bb;
    if ((ba != batch && ba != 1) || (bb != batch && bb != 1) || count(out) != batch * m * n)
        return 1;
    const float *a = in[0].data, *b = in[1].data;
    float *y = out->data;
    for (int64_t p = 0; p < batch; p++) {
        const float *ap = a + (ba == 1 ? 0 : p) * m * k, *bp = b + (bb == 1 ? 0 : p) * k * n;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float acc = 0.0f;
                for (int64_t q = 0; q < k; q++)
                    acc += ap[i * k + q] * bp[q * n + j];
                y[p * m * n + i * n + j] = acc;
            }
    }
    return 0;
}

mlc_library_fn mlc_builtin_library(const char *name)
{
    static const struct { const char *name; mlc_library_fn fn; } table[] = {
        {"env.linear", lib_linear}, {"env.relu", lib_relu}, {"env.softmax", lib_softmax},
        {"env.matmul", lib_matmul}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].name, name))
            return table[i].fn;
    return NULL;
}
