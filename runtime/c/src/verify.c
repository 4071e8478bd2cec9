/* The golden check (runtime/verify.py): run the bundle's embedded input, compare each output with
 * the reference by the Python runtime's rule (float32 roundings of the magnitude involved, the
 * recorded rtol/atol, SNR + cosine for scattered outliers, quantization steps; integers exact),
 * and for a dynamic-batch bundle its first b rows for every smaller plan size b. Allocates the
 * output buffers it compares (verify is not a run). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define EPS_F32 (1.0 / 8388608.0)
#define ROUNDING_K 64.0
#define MIN_SNR_DB 80.0
#define QUANT_STEPS 2.0
#define QUANT_MIN_SNR_DB 30.0
/* a quantized output also passes at an RMS error of at most this many steps whose mean is at
 * most one step (runtime/verify.py's QUANT_RMS_STEPS: tie flips scattered both ways) */
#define QUANT_RMS_STEPS 4.0
#define NARROW_K 4.0

static double half_to_double(uint16_t h)
{
    int e = h >> 10 & 0x1F, f = h & 0x3FF;
    double v = e == 0 ? ldexp(f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexp(f + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

static double value(const void *p, mlc_dtype d, size_t i)
{
    switch (mlc_storage(d)) {
    case MLC_FLOAT32: return ((const float *)p)[i];
    case MLC_FLOAT64: return ((const double *)p)[i];
    case MLC_FLOAT16: return half_to_double(((const uint16_t *)p)[i]);
    case MLC_INT8: return ((const int8_t *)p)[i];
    case MLC_INT16: return ((const int16_t *)p)[i];
    case MLC_INT32: return ((const int32_t *)p)[i];
    case MLC_INT64: return (double)((const int64_t *)p)[i];
    case MLC_UINT8: case MLC_BOOL: return ((const uint8_t *)p)[i];
    case MLC_UINT16: return ((const uint16_t *)p)[i];
    case MLC_UINT32: return ((const uint32_t *)p)[i];
    case MLC_UINT64: return (double)((const uint64_t *)p)[i];
    default: return 0;
    }
}

static int is_float(mlc_dtype d)
{
    return d == MLC_FLOAT32 || d == MLC_FLOAT64 || d == MLC_FLOAT16;
}

typedef struct {
    double max_abs, max_rel, snr;
    int ok;
    char why[200];
} check;

/* One output: got (dtype gd) against ref (dtype rd), `count` elements. */
static check compare(const void *got, mlc_dtype gd, const void *ref, mlc_dtype rd, size_t count,
                     double rtol, double atol, double magnitude, double step)
{
    check c = {0, 0, INFINITY, 1, ""};
    if (!count)
        return c;
    if (!is_float(rd) && !is_float(gd)) {
        double allowed = step > 0 ? QUANT_STEPS * step : 0, worst = 0;
        size_t bad = 0, at = 0;
        for (size_t i = 0; i < count; i++) {
            double d = fabs(value(got, gd, i) - value(ref, rd, i));
            bad += d > allowed;
            if (d > worst) {
                worst = d;
                at = i;
            }
        }
        c.max_abs = worst;
        if (bad) {
            c.ok = 0;
            c.max_rel = 1;
            c.snr = -INFINITY;
            snprintf(c.why, sizeof c.why, "differs in %zu of %zu values (integers must match); "
                     "worst at flat index %zu: got %g, reference %g", bad, count, at,
                     value(got, gd, at), value(ref, rd, at));
        }
        return c;
    }
    double narrow = rd == MLC_FLOAT16 || gd == MLC_FLOAT16 ? 1.0 / 1024 : 0;
    double big = rd == MLC_FLOAT64 ? 1.7976931348623157e308 : rd == MLC_FLOAT16 ? 65504.0
                                                                                : 3.4028234663852886e38;
    double scale = 0;
    int any_finite = 0;
    for (size_t i = 0; i < count; i++) {
        double r = value(ref, rd, i);
        if (isfinite(r)) {
            any_finite = 1;
            scale = fabs(r) > scale ? fabs(r) : scale;
        }
    }
    if (!any_finite || scale == 0)
        scale = 1;
    double mag = magnitude >= 0 && magnitude > scale ? magnitude : scale;
    double rounding = mag * (ROUNDING_K * EPS_F32 + NARROW_K * narrow);
    double base = atol * scale > rounding ? atol * scale : rounding;
    double noise = 0, signal = 0, dot = 0, gg = 0, rr = 0, worst_excess = -INFINITY;
    double squares = 0, signed_sum = 0; /* every element's error: the quantized RMS rule */
    int err_finite = 1;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < count; i++) {
        double g = value(got, gd, i), r = value(ref, rd, i);
        int sat = fabs(g) >= big && fabs(r) >= big && ((g > 0) == (r > 0)) && g != 0;
        int special = (isnan(g) && isnan(r)) || (isinf(r) && g == r) || sat;
        double e = special ? 0 : fabs(g - r);
        if (isnan(e))
            e = INFINITY;
        if (!isfinite(e))
            err_finite = 0;
        else if (e > 0) {
            squares += e * e;
            signed_sum += g - r;
        }
        double allowed = base + rtol * (isfinite(r) ? fabs(r) : 0) + (step >= 0 ? QUANT_STEPS * step : 0);
        if (e > allowed) {
            bad++;
            if (e - allowed > worst_excess) {
                worst_excess = e - allowed;
                at = i;
            }
        }
        c.max_abs = e > c.max_abs ? e : c.max_abs;
        double gz = special ? 0 : g, rz = special ? 0 : r;
        if (isfinite(rz) && isfinite(gz)) {
            noise += e * e;
            signal += rz * rz;
            dot += gz * rz;
            gg += gz * gz;
            rr += rz * rz;
        }
    }
    if (!err_finite)
        c.snr = -INFINITY;
    else if (noise == 0)
        c.snr = INFINITY;
    else if (signal == 0)
        c.snr = -INFINITY;
    else
        c.snr = 10 * log10(signal / noise);
    double norms = sqrt(gg) * sqrt(rr);
    double cosine = norms > 0 ? dot / norms : (noise == 0);
    c.max_rel = c.max_abs / scale;
    int scattered = step > 0 && err_finite && sqrt(squares / count) <= QUANT_RMS_STEPS * step &&
                    fabs(signed_sum / count) <= step;
    if (bad == 0 || c.snr >= (step >= 0 ? QUANT_MIN_SNR_DB : MIN_SNR_DB) || scattered)
        return c;
    c.ok = 0;
    snprintf(c.why, sizeof c.why, "differs beyond the tolerance in %zu of %zu values (SNR %.1f "
             "dB, cosine similarity %.6f); worst at flat index %zu: got %.7g, reference %.7g",
             bad, count, c.snr, cosine, at, value(got, gd, at), value(ref, rd, at));
    return c;
}

mlc_status mlc_verify(mlc_model *m, char *summary, size_t summary_size, mlc_error *err)
{
    if (!m)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_verify: model is NULL");
    if (summary && summary_size)
        summary[0] = 0;
    if (!m->has_golden)
        return mlc_fail(err, MLC_ERR_NO_GOLDEN, "%s carries no golden data (exported before "
                        "mlcpack embedded it, with --no-check, or the pair was too large): "
                        "nothing to verify; export it again to add it", m->name);
    for (size_t k = 0; k < m->ngolden_in + m->ngolden_out; k++) {
        const mlc_golden_row *row = k < m->ngolden_in ? &m->golden_in[k]
                                                      : &m->golden_out[k - m->ngolden_in];
        uint64_t nb;
        if (mlc_nbytes(row->shape, row->ndim, row->dtype, &nb) || nb != row->data.size)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: payload size %llu does not match the "
                            "golden %s '%s''s shape and dtype", m->name,
                            (unsigned long long)row->data.size,
                            k < m->ngolden_in ? "input" : "output", row->name);
    }
    const mlc_plan *last = &m->plans[m->nplans - 1];
    size_t nin = last->ninputs, nout = last->noutputs;
    int ok_names = m->ngolden_in == nin && m->ngolden_out == nout;
    mlc_tensor *ins = calloc(nin + 1, sizeof *ins), *outs = calloc(nout + 1, sizeof *outs);
    const mlc_golden_row **refs = calloc(nout + 1, sizeof *refs);
    mlc_status s = MLC_OK;
    if (!ins || !outs || !refs) {
        s = mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        goto done;
    }
    for (size_t i = 0; ok_names && i < nin; i++) {
        const mlc_golden_row *g = NULL;
        for (size_t j = 0; j < m->ngolden_in; j++)
            if (!strcmp(m->golden_in[j].name, last->inputs[i].name))
                g = &m->golden_in[j];
        if (!g) {
            ok_names = 0;
            break;
        }
        ins[i].data = (void *)(m->data + m->data_start + g->data.off);
        ins[i].nbytes = (size_t)g->data.size;
        ins[i].dtype = g->dtype;
        ins[i].ndim = g->ndim;
        memcpy(ins[i].dims, g->shape, sizeof g->shape);
    }
    for (size_t i = 0; ok_names && i < nout; i++) {
        for (size_t j = 0; j < m->ngolden_out; j++)
            if (!strcmp(m->golden_out[j].name, last->outputs[i].name))
                refs[i] = &m->golden_out[j];
        if (!refs[i])
            ok_names = 0;
    }
    if (!ok_names) {
        s = mlc_fail(err, MLC_ERR_BUNDLE, "%s: golden data names other tensors than the "
                     "model's inputs and outputs", m->name);
        goto done;
    }
    int64_t nrows = 0;
    for (size_t i = 0; i < nin; i++)
        if (last->inputs[i].batched && ins[i].ndim > 0)
            nrows = ins[i].dims[0];
    double max_abs = 0, max_rel = 0, min_snr = INFINITY;
    size_t checks = 0;
    int all_ok = 1;
    char why[300] = "", rows_text[128] = "";
    /* the whole pair, then its first b rows for each smaller plan size b */
    for (size_t round = 0; round <= (m->batched ? m->nplans : 0); round++) {
        int64_t b = -1;
        if (round > 0) {
            b = m->plans[round - 1].batch;
            if (b >= nrows)
                continue;
            size_t len = strlen(rows_text);
            snprintf(rows_text + len, sizeof rows_text - len, "%s%lld", len ? ", " : "",
                     (long long)b);
        }
        mlc_tensor *run_in = calloc(nin + 1, sizeof *run_in);
        if (!run_in) {
            s = mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
            goto done;
        }
        memcpy(run_in, ins, nin * sizeof *ins);
        for (size_t i = 0; b >= 0 && i < nin; i++)
            if (last->inputs[i].batched)
                run_in[i].dims[0] = b;
        for (size_t i = 0; i < nout; i++) {
            size_t need = 0;
            if ((s = mlc_output_nbytes(m, i, run_in, nin, &need, err)))
                break;
            free(outs[i].data);
            outs[i].data = malloc(need ? need : 1);
            outs[i].nbytes = need;
            if (!outs[i].data) {
                s = mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
                break;
            }
        }
        if (!s)
            s = mlc_run(m, run_in, nin, outs, nout, err);
        free(run_in);
        if (s)
            goto done;
        for (size_t i = 0; i < nout; i++) {
            const mlc_golden_row *r = refs[i];
            size_t count = 1, rcount = 1;
            for (int d = 0; d < outs[i].ndim; d++)
                count *= (size_t)outs[i].dims[d];
            for (int d = 0; d < r->ndim; d++)
                rcount *= (size_t)r->shape[d];
            int batched_out = last->outputs[i].batched && b >= 0;
            if (batched_out && r->ndim > 0)
                rcount = rcount / (size_t)(r->shape[0] ? r->shape[0] : 1) * (size_t)b;
            /* shapes: equal, or a scalar against a one-element (1,) */
            int same = outs[i].ndim == r->ndim;
            for (int d = 0; same && d < r->ndim; d++)
                if (outs[i].dims[d] != ((batched_out && d == 0) ? b : r->shape[d]))
                    same = 0;
            if (!same && !(count == 1 && rcount == 1 && abs(outs[i].ndim - r->ndim) == 1
                           && (outs[i].ndim == 0 || r->ndim == 0)))
                same = -1;
            check c;
            if (same < 0) {
                c = (check){INFINITY, INFINITY, -INFINITY, 0, "has another shape than the "
                                                              "reference"};
            } else {
                c = compare(outs[i].data, outs[i].dtype,
                            m->data + m->data_start + r->data.off, r->dtype, count, m->rtol,
                            m->atol, r->magnitude, r->quant_step);
            }
            checks++;
            max_abs = c.max_abs > max_abs ? c.max_abs : max_abs;
            max_rel = c.max_rel > max_rel ? c.max_rel : max_rel;
            min_snr = c.snr < min_snr ? c.snr : min_snr;
            if (!c.ok && all_ok) {
                all_ok = 0;
                char rows[48] = "";
                if (b >= 0)
                    snprintf(rows, sizeof rows, " (first %lld rows)", (long long)b);
                snprintf(why, sizeof why, "; output '%s'%s %s", last->outputs[i].name, rows,
                         c.why);
            }
        }
    }
    if (summary && summary_size) {
        char snr[48] = "";
        if (isfinite(min_snr))
            snprintf(snr, sizeof snr, ", min SNR %.0f dB", min_snr);
        char also[160] = "";
        if (rows_text[0])
            snprintf(also, sizeof also, ", also its first %s rows", rows_text);
        snprintf(summary, summary_size, "%s: %zu output checks%s; max abs error %.3g, max rel "
                 "error %.3g%s (tolerance rtol %g, atol %g x output scale, at least %g float32 "
                 "roundings)%s", m->name, checks, also, max_abs, max_rel, snr, m->rtol, m->atol,
                 ROUNDING_K, all_ok ? "" : why);
    }
    if (!all_ok)
        s = mlc_fail(err, MLC_ERR_MISMATCH, "%s does not reproduce its golden output%s", m->name,
                     why);
done:
    for (size_t i = 0; outs && i < nout; i++)
        free(outs[i].data);
    free(ins);
    free(outs);
    free(refs);
    return s;
}
