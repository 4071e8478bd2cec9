/* Running a model: input checks, the program (the bundle's native step loop when it has one,
 * else one call per instruction), static, batch and symbolic plans, zero-copy bindings. Nothing
 * here allocates (an unbounded symbolic plan's arena growth is symbolic.c's). */
#include <stdio.h>
#include <string.h>

#include "model.h"

/* An instruction that is not a kernel call: a copy, or a library function. */
static mlc_status step(const mlc_model *m, mlc_plan *p, const mlc_instr *in,
                       mlc_error *err)
{
    if (in->op == OP_COPY) {   /* a symbolic plan's tensors have this shape's byte sizes */
        memcpy(p->addr[in->operands[0]], p->addr[in->target],
               (size_t)(p->sym ? p->sym->tbytes[in->target] : p->tensors[in->target].nbytes));
        return MLC_OK;
    }
    if (in->op == OP_BIND) {   /* a size a kernel counted, within its bound for this shape */
        int64_t v;
        memcpy(&v, p->addr[in->operands[0]], 8);
        if (v < 0 || v > p->sym->limits[in->target])
            return mlc_fail(err, MLC_ERR_INPUT, "%s: a size the model computes at run time is "
                            "%lld, outside [0, %lld] (its bound for these input sizes; a Loop's carried "
                            "value grown past its cap)", m->name,
                            (long long)v, (long long)p->sym->limits[in->target]);
        p->sym->sizes[in->target] = v;
        return MLC_OK;
    }
    if (in->op == OP_APPEND)   /* format 1.9: a row of a scan output with no bound */
        return mlc_store_append(m, p, in, err);
    if (in->op == OP_TRAP && in->target == 0)
        return mlc_fail(err, MLC_ERR_INPUT, "%s: these input sizes take a branch of one of the "
                        "model's If nodes that the export could not compile (the other branch "
                        "was compiled): give inputs of the sizes the model is made for", m->name);
    if (in->op == OP_TRAP && in->target == 2)   /* format 1.9 */
        return mlc_fail(err, MLC_ERR_INPUT, "%s: at these inputs a carried value of one of the "
                        "model's Loop nodes changes shape between iterations (a size the loop's "
                        "body computes), which this bundle's loop does not run: its export "
                        "assumed the shape stays", m->name);
    if (in->op == OP_TRAP)
        return mlc_fail(err, MLC_ERR_INPUT, "%s: these input sizes break a size relation that "
                        "the branch of one of the model's If nodes they take needs (a Squeeze of "
                        "an axis whose size is not 1, a Reshape whose element counts differ): "
                        "give inputs of the sizes the model is made for", m->name);
    const mlc_site *site = &p->sites[in->target];
    if (site->fn(site->user, in->tensors, (int)in->n - 1, &in->tensors[in->n - 1], &site->attrs))
        return mlc_fail(err, MLC_ERR_INTERNAL, "%s: library function %s failed", m->name,
                        site->func);
    return MLC_OK;
}

/* Where a jump continues: its target, or (JUMP_UNLESS whose condition holds) the next one. A
 * LOOP reads its count once and runs iteration 0 (the next instruction) if it is positive and
 * the condition holds, else continues after its NEXT; a NEXT runs the next iteration (from the
 * instruction after its LOOP) while it is below that count and its condition holds. The count
 * is the plan's (loop_iter, loop_limit), never a tensor's: each loop ends. */
static size_t jump_next(mlc_plan *p, const mlc_instr *in, size_t i)
{
    if (in->op == OP_LOOP) {
        int64_t count;
        memcpy(&count, p->addr[in->operands[0]], 8);
        if (count <= 0 || !*(const uint8_t *)p->addr[in->operands[1]])
            return in->target;
        p->loop_iter[i] = 0;
        p->loop_limit[i] = count;
        memset(p->addr[in->operands[2]], 0, 8);
        return i + 1;
    }
    if (in->op == OP_NEXT) {
        size_t head = in->target;
        int64_t k = p->loop_iter[head] + 1;
        if (k >= p->loop_limit[head] || !*(const uint8_t *)p->addr[in->operands[0]])
            return i + 1;
        p->loop_iter[head] = k;
        memcpy(p->addr[p->program[head].operands[2]], &k, 8);
        return head + 1;
    }
    if (in->op == OP_JUMP_UNLESS && *(const uint8_t *)p->addr[in->operands[0]])
        return i + 1;
    return in->target;
}

static int is_jump(int op)
{
    return op == OP_JUMP || op == OP_JUMP_UNLESS || op == OP_LOOP || op == OP_NEXT;
}

static mlc_status execute(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    mlc_status s;
    for (size_t k = 0; k < p->nstores; k++)   /* format 1.9: each run appends from row 0 */
        p->stores[k].count = 0;
    if (p->segments) {
        for (size_t i = 0; i < p->nsegments;) {
            const mlc_segment *seg = &p->segments[i];
            if (seg->start >= 0) {
                mlc_threads_steps(p->threads, &p->pool, p->table, seg->start, seg->end);
                i++;
                continue;
            }
            size_t at = (size_t)(-1 - seg->start);
            const mlc_instr *in = &p->program[at];
            if (is_jump(in->op)) {   /* a later segment, or a NEXT's back edge */
                i = p->segment_at[jump_next(p, in, at)];
                continue;
            }
            if ((s = step(m, p, in, err)))
                return s;
            i++;
        }
        return MLC_OK;
    }
    for (size_t i = 0; i < p->nprogram; i++) {
        const mlc_instr *in = &p->program[i];
        if (is_jump(in->op)) {
            i = jump_next(p, in, i) - 1;   /* the loop's i++ lands on it */
            continue;
        }
        if (in->op == OP_KERNEL) {
            mlc_kernel_fn fn = (mlc_kernel_fn)p->kernel_addr[in->target];
            if (p->threads && p->kernels[in->target].parallel)
                mlc_threads_run(p->threads, fn, in->args,
                                mlc_task_count(m->threads, p->kernels[in->target].macs,
                                               p->has_pool && p->pool.ranges));
            else
                fn(in->args, 0, 1);
        } else if ((s = step(m, p, in, err))) {
            return s;
        }
    }
    return MLC_OK;
}

static void shape_text(const int64_t *dims, int ndim, char *out, size_t size, int batch_n)
{
    size_t len = (size_t)snprintf(out, size, "(");
    for (int i = 0; i < ndim && len < size; i++) {
        if (i == 0 && batch_n)
            len += (size_t)snprintf(out + len, size - len, "N");
        else
            len += (size_t)snprintf(out + len, size - len, "%s%lld", i ? ", " : "",
                                    (long long)dims[i]);
        if (i == 0 && batch_n && ndim > 1)
            len += (size_t)snprintf(out + len, size - len, "%s", "");
    }
    if (len < size)
        snprintf(out + len, size - len, "%s)", ndim == 1 ? "," : "");
}

static int dtype_ok(mlc_dtype want, mlc_dtype got)
{
    return got == want || (mlc_storage(want) != want && got == mlc_storage(want));
}

/* The input's dtype and, batched, its dims past the first (any batch >= 1); else all dims. */
static mlc_status check_input(const mlc_model *m, const mlc_iorow *spec, const mlc_tensor *t,
                              mlc_error *err)
{
    char want[160], got[160];
    if (!t->data && t->nbytes)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has no data", spec->name);
    if (!dtype_ok(spec->dtype, t->dtype))
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has dtype %s; the model takes %s",
                        spec->name, mlc_dtype_name(t->dtype), mlc_dtype_name(spec->dtype));
    if (t->ndim < 0 || t->ndim > MLC_MAX_DIMS)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has rank %d; the model takes rank %d",
                        spec->name, t->ndim, spec->ndim);
    int same = t->ndim == spec->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        if (t->dims[d] != spec->shape[d] && !(spec->batched && d == 0))
            same = 0;
    int batch_bad = same && spec->batched && t->dims[0] < 1;
    if (!same || batch_bad) {   /* the shapes as text only for the message: not on every run */
        shape_text(t->dims, t->ndim, got, sizeof got, 0);
        shape_text(spec->shape, spec->ndim, want, sizeof want, spec->batched);
    }
    if (!same) {
        if (spec->batched)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has shape %s; the model takes %s for "
                            "any batch N >= 1", spec->name, got, want);
        if (t->ndim != spec->ndim)
            return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has rank %d (shape %s); the model "
                            "takes rank %d shape %s", spec->name, t->ndim, got, spec->ndim, want);
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has shape %s; the model takes %s",
                        spec->name, got, want);
    }
    if (batch_bad)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has a batch of %lld; the model takes %s "
                        "for any batch N >= 1", spec->name, (long long)t->dims[0], want);
    uint64_t need;
    if (mlc_nbytes(t->dims, t->ndim, spec->dtype, &need) || t->nbytes < need)
        return mlc_fail(err, MLC_ERR_INPUT, "input '%s': its buffer holds %zu bytes, its shape "
                        "needs more", spec->name, t->nbytes);
    (void)m;
    return MLC_OK;
}

/* A symbolic bundle's static plan (--batch-sizes) whose inputs have exactly these shapes and
 * storage dtypes (runtime/model._specialized_plan), or NULL. */
static mlc_plan *specialized_for(const mlc_model *m, const mlc_tensor *in, size_t n)
{
    for (size_t k = 0; k < m->nspecialized; k++) {
        mlc_plan *sp = &m->specialized[k];
        int same = n == sp->ninputs;
        for (size_t i = 0; same && i < n; i++) {
            const mlc_iorow *io = &sp->inputs[i];
            same = in[i].dtype == mlc_storage(io->dtype) && in[i].ndim == io->ndim
                   && !memcmp(in[i].dims, io->shape, (size_t)io->ndim * sizeof(int64_t));
        }
        if (same)
            return sp;
    }
    return NULL;
}

/* Output i's bytes for a symbolic plan at the sizes the inputs bind (unchecked: mlc_run checks). */
static mlc_status sym_output_nbytes(const mlc_model *m, size_t i, const mlc_tensor *in,
                                    size_t n, size_t *nbytes, mlc_error *err)
{
    const mlc_plan *p = &m->plans[0];
    const mlc_plan *sp = in ? specialized_for(m, in, n) : NULL;
    if (sp) {
        *nbytes = (size_t)sp->tensors[sp->outputs[i].tensor].nbytes;
        return MLC_OK;
    }
    int64_t env[64];
    size_t nvars = p->sym->nvars;
    if (!in || n != p->ninputs || nvars > 64)
        return mlc_fail(err, MLC_ERR_INPUT, "mlc_output_nbytes: give the inputs (their shapes "
                        "bind the size variables)");
    for (size_t v = 0; v < nvars; v++)
        env[v] = -1;
    for (size_t k = 0; k < n; k++)
        for (int a = 0; a < p->inputs[k].ndim && a < in[k].ndim; a++) {
            const mp_node *rec = &p->inputs[k].rec->v.items[a];
            for (size_t v = 0; rec->type == MP_STR && v < nvars; v++)
                if (mp_str_eq(rec, p->sym->vars[v]))
                    env[v] = in[k].dims[a];
        }
    mlc_status st = mlc_sym_values(m, p, in, env, NULL, err);   /* sizes set by values */
    if (st)
        return st;
    for (size_t v = 0; v < nvars; v++)
        if (env[v] < 1 && !mlc_sym_counted(p->sym, v))
            return mlc_fail(err, MLC_ERR_INPUT, "the inputs bind no valid size %s",
                            p->sym->vars[v]);
    if (mlc_sym_counted_env(p, env))   /* counted at run time: its bound's bytes */
        return mlc_fail(err, MLC_ERR_INPUT, "the inputs' sizes overflow the model's size "
                        "expressions");
    const mlc_trow *t = &p->tensors[p->outputs[i].tensor];
    int64_t dims[MLC_MAX_DIMS];
    uint64_t total;
    for (uint32_t d = 0; d < t->rec->len; d++)
        if (mlc_sym_eval(p, &t->rec->v.items[d], env, &dims[d]) || dims[d] < 0)
            return mlc_fail(err, MLC_ERR_INPUT, "output '%s' has no valid size for these inputs",
                            p->outputs[i].name);
    if (mlc_nbytes(dims, (int)t->rec->len, t->dtype, &total) || total > SIZE_MAX)
        return mlc_fail(err, MLC_ERR_INPUT, "output '%s' is too large", p->outputs[i].name);
    *nbytes = (size_t)total;
    return MLC_OK;
}

mlc_status mlc_output_nbytes(const mlc_model *m, size_t i, const mlc_tensor *inputs,
                             size_t ninputs, size_t *nbytes, mlc_error *err)
{
    if (!m || !nbytes || i >= m->plans[0].noutputs)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_output_nbytes: bad arguments");
    if (m->plans[0].sym)
        return sym_output_nbytes(m, i, inputs, ninputs, nbytes, err);
    const mlc_plan *last = &m->plans[m->nplans - 1];
    const mlc_iorow *o = &last->outputs[i];
    if (!o->batched) {
        *nbytes = (size_t)last->tensors[o->tensor].nbytes;
        return MLC_OK;
    }
    int64_t n = -1;
    for (size_t k = 0; k < last->ninputs && k < ninputs; k++)
        if (last->inputs[k].batched && inputs[k].ndim > 0)
            n = inputs[k].dims[0];
    if (n < 1)
        return mlc_fail(err, MLC_ERR_INPUT, "mlc_output_nbytes: the batched inputs give no "
                        "batch size");
    uint64_t row = last->tensors[o->tensor].nbytes / (uint64_t)last->batch, total;
    if (__builtin_mul_overflow(row, (uint64_t)n, &total) || total > SIZE_MAX)
        return mlc_fail(err, MLC_ERR_INPUT, "output '%s' is too large", o->name);
    *nbytes = (size_t)total;
    return MLC_OK;
}

static void set_output(mlc_tensor *t, const mlc_trow *row, int64_t batch)
{
    t->dtype = row->dtype;
    t->ndim = row->ndim;
    memset(t->dims, 0, sizeof t->dims);
    memcpy(t->dims, row->shape, (size_t)row->ndim * sizeof(int64_t));
    if (batch >= 0)
        t->dims[0] = batch;
}

static mlc_status run_batched(mlc_model *m, const mlc_tensor *inputs, mlc_tensor *outputs,
                              int64_t n, mlc_error *err)
{
    const mlc_plan *largest = &m->plans[m->nplans - 1];
    int64_t done = 0;
    while (done < n) {
        int64_t chunk = n - done < largest->batch ? n - done : largest->batch;
        mlc_plan *p = &m->plans[0];
        for (size_t k = 0; k < m->nplans; k++)
            if (m->plans[k].batch >= chunk) {
                p = &m->plans[k];
                break;
            }
        for (size_t i = 0; i < p->ninputs; i++) {
            const mlc_iorow *io = &p->inputs[i];
            uint8_t *dst = p->addr[io->tensor];
            if (!io->batched) {
                memcpy(dst, inputs[i].data, (size_t)io->nbytes);
                continue;
            }
            size_t row = (size_t)(io->nbytes / (uint64_t)p->batch);
            memcpy(dst, (const uint8_t *)inputs[i].data + (size_t)done * row, (size_t)chunk * row);
            memset(dst + (size_t)chunk * row, 0, (size_t)(p->batch - chunk) * row);
        }
        mlc_status s = execute(m, p, err);
        if (s)
            return s;
        for (size_t i = 0; i < p->noutputs; i++) {
            const mlc_iorow *io = &p->outputs[i];
            size_t row = (size_t)(p->tensors[io->tensor].nbytes / (uint64_t)p->batch);
            memcpy((uint8_t *)outputs[i].data + (size_t)done * row, p->addr[io->tensor],
                   (size_t)chunk * row);
        }
        done += chunk;
    }
    return MLC_OK;
}

/* One run of a static plan with fixed shapes: check, copy in, execute, copy out. */
static mlc_status run_static(mlc_model *m, mlc_plan *p, const mlc_tensor *inputs,
                             mlc_tensor *outputs, mlc_error *err)
{
    for (size_t i = 0; i < p->ninputs; i++) {
        mlc_status s = check_input(m, &p->inputs[i], &inputs[i], err);
        if (s)
            return s;
    }
    for (size_t i = 0; i < p->noutputs; i++) {
        size_t need = (size_t)p->tensors[p->outputs[i].tensor].nbytes;
        if (!outputs[i].data || outputs[i].nbytes < need)
            return mlc_fail(err, MLC_ERR_USAGE, "output '%s' needs a buffer of %zu bytes, got "
                            "%zu", p->outputs[i].name, need, outputs[i].nbytes);
    }
    /* zero-copy: kernels read an input where the caller holds it (element-aligned) and write
     * an output into the caller's buffer (64-byte aligned, overlapping no input or other
     * bound output), where the bundle's views allow it; else copies through the arena */
    uint64_t bound = 0;
    for (size_t i = 0; i < p->ninputs; i++) {
        const mlc_iorow *io = &p->inputs[i];
        size_t align = mlc_dtype_size(io->dtype);
        void *at = p->addr[io->tensor];
        if (io->bindable && (uintptr_t)inputs[i].data % align == 0)
            at = inputs[i].data;
        else
            memcpy(at, inputs[i].data, (size_t)io->nbytes);
        for (size_t k = 0; k < io->nslots; k++)
            *io->slots[k] = at;
    }
    for (size_t i = 0; i < p->noutputs && i < 64; i++) {
        const mlc_iorow *io = &p->outputs[i];
        size_t size = (size_t)p->tensors[io->tensor].nbytes;
        uintptr_t lo = (uintptr_t)outputs[i].data, hi = lo + size;
        int ok = io->bindable && lo % 64 == 0;
        for (size_t k = 0; ok && k < p->ninputs; k++) {
            uintptr_t a = (uintptr_t)inputs[k].data, b = a + (size_t)p->inputs[k].nbytes;
            ok = hi <= a || b <= lo;
        }
        for (size_t k = 0; ok && k < i; k++)
            if (bound >> k & 1) {
                uintptr_t a = (uintptr_t)outputs[k].data;
                ok = hi <= a || a + (size_t)p->tensors[p->outputs[k].tensor].nbytes <= lo;
            }
        if (!ok)
            continue;
        bound |= 1ull << i;
        for (size_t k = 0; k < io->nslots; k++)
            *io->slots[k] = outputs[i].data;
    }
    mlc_status s = execute(m, p, err);
    for (size_t i = 0; i < p->ninputs; i++)   /* the arena's copies again */
        for (size_t k = 0; k < p->inputs[i].nslots; k++)
            *p->inputs[i].slots[k] = p->addr[p->inputs[i].tensor];
    for (size_t i = 0; i < p->noutputs; i++) {
        const mlc_iorow *io = &p->outputs[i];
        const mlc_trow *row = &p->tensors[io->tensor];
        if (i < 64 && bound >> i & 1) {
            for (size_t k = 0; k < io->nslots; k++)
                *io->slots[k] = p->addr[io->tensor];
        } else if (!s) {
            memcpy(outputs[i].data, p->addr[io->tensor], (size_t)row->nbytes);
        }
        if (!s)
            set_output(&outputs[i], row, -1);
    }
    return s;
}

static mlc_status run_symbolic(mlc_model *m, const mlc_tensor *inputs, mlc_tensor *outputs,
                               mlc_error *err)
{
    mlc_plan *p = &m->plans[0];
    mlc_plan *sp = specialized_for(m, inputs, p->ninputs);
    if (sp)
        return run_static(m, sp, inputs, outputs, err);
    mlc_status s = mlc_sym_bind(m, p, inputs, err);
    if (!s)
        s = mlc_sym_plan(m, p, err);
    if (s)
        return s;
    mlc_symbolic *sym = p->sym;
    for (size_t i = 0; i < p->noutputs; i++) {
        if (p->tensors[p->outputs[i].tensor].kind == T_STORE)
            continue;   /* its rows are counted during the run: checked after it */
        size_t need = (size_t)sym->tbytes[p->outputs[i].tensor];
        if (!outputs[i].data || outputs[i].nbytes < need)
            return mlc_fail(err, MLC_ERR_USAGE, "output '%s' needs a buffer of %zu bytes, got "
                            "%zu", p->outputs[i].name, need, outputs[i].nbytes);
    }
    for (size_t i = 0; i < p->ninputs; i++) {
        uint32_t t = p->inputs[i].tensor;
        if (p->tensors[t].kind != T_ARENA)
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: input '%s' is not in the arena",
                            p->inputs[i].name);
        memcpy(p->addr[t], inputs[i].data, (size_t)sym->tbytes[t]);
    }
    s = execute(m, p, err);
    for (size_t i = 0; !s && i < p->noutputs; i++) {   /* format 1.9: before any is written */
        uint32_t t = p->outputs[i].tensor;
        if (p->tensors[t].kind != T_STORE)
            continue;
        const mlc_store *st = &p->stores[p->store_of[t]];
        uint64_t bytes = st->count ? (uint64_t)st->count * st->row_bytes : 0;
        if ((!outputs[i].data && bytes) || outputs[i].nbytes < bytes)
            return mlc_fail(err, MLC_ERR_USAGE, "output '%s' has %lld rows this run and needs a "
                            "buffer of %llu bytes, got %zu: run again with one that large",
                            p->outputs[i].name, (long long)st->count,
                            (unsigned long long)bytes, outputs[i].nbytes);
    }
    for (size_t i = 0; !s && i < p->noutputs; i++) {
        uint32_t t = p->outputs[i].tensor;
        const mlc_trow *row = &p->tensors[t];
        outputs[i].dtype = row->dtype;
        outputs[i].ndim = row->ndim;
        memcpy(outputs[i].dims, sym->tdims + (size_t)t * MLC_MAX_DIMS, sizeof outputs[i].dims);
        uint64_t bytes = sym->tbytes[t];
        if (sym->ndynamic) {   /* sizes a kernel counted: the leading part of the bound's */
            for (uint32_t d = 0; d < row->rec->len; d++)
                if (mlc_sym_eval(p, &row->rec->v.items[d], sym->sizes, &outputs[i].dims[d])
                    || outputs[i].dims[d] < 0)
                    return mlc_fail(err, MLC_ERR_BUNDLE, "%s: output '%s' has no valid size",
                                    m->name, p->outputs[i].name);
            if (mlc_nbytes(outputs[i].dims, (int)row->rec->len, row->dtype, &bytes)
                || bytes > sym->tbytes[t])
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: output '%s' outgrew its bound",
                                m->name, p->outputs[i].name);
        }
        if (row->kind == T_STORE) {   /* format 1.9: the rows the VM appended */
            const mlc_store *st = &p->stores[p->store_of[t]];
            if (bytes != (st->count ? (uint64_t)st->count * st->row_bytes : 0)
                || outputs[i].dims[st->lead] != st->count)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: output '%s' has %lld rows appended, "
                                "its shape says otherwise", m->name, p->outputs[i].name,
                                (long long)st->count);
            if (bytes)
                memcpy(outputs[i].data, st->data, (size_t)bytes);
            continue;
        }
        memcpy(outputs[i].data, p->addr[t], (size_t)bytes);
    }
    return s;
}

mlc_status mlc_run(mlc_model *m, const mlc_tensor *inputs, size_t ninputs, mlc_tensor *outputs,
                   size_t noutputs, mlc_error *err)
{
    if (!m)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_run: model is NULL");
    mlc_plan *last = &m->plans[m->nplans - 1];
    if (ninputs != last->ninputs || (ninputs && !inputs))
        return mlc_fail(err, MLC_ERR_INPUT, "%s takes %zu input(s), got %zu", m->name,
                        last->ninputs, ninputs);
    if (noutputs != last->noutputs || (noutputs && !outputs))
        return mlc_fail(err, MLC_ERR_USAGE, "%s has %zu output(s); mlc_run was given %zu",
                        m->name, last->noutputs, noutputs);
    if (last->sym) {
        pthread_mutex_lock(&m->lock);
        mlc_status s = run_symbolic(m, inputs, outputs, err);
        pthread_mutex_unlock(&m->lock);
        return s;
    }
    int64_t n = -1;
    for (size_t i = 0; i < ninputs; i++) {
        mlc_status s = check_input(m, &last->inputs[i], &inputs[i], err);
        if (s)
            return s;
        if (last->inputs[i].batched) {
            if (n >= 0 && inputs[i].dims[0] != n)
                return mlc_fail(err, MLC_ERR_INPUT, "input '%s' has batch %lld, another input "
                                "has %lld: the batched inputs must agree", last->inputs[i].name,
                                (long long)inputs[i].dims[0], (long long)n);
            n = inputs[i].dims[0];
        }
    }
    for (size_t i = 0; i < noutputs; i++) {
        size_t need;
        mlc_status s = mlc_output_nbytes(m, i, inputs, ninputs, &need, err);
        if (s)
            return s;
        if (!outputs[i].data || outputs[i].nbytes < need)
            return mlc_fail(err, MLC_ERR_USAGE, "output '%s' needs a buffer of %zu bytes, got "
                            "%zu", last->outputs[i].name, need, outputs[i].nbytes);
    }
    pthread_mutex_lock(&m->lock);
    mlc_status s = m->batched ? run_batched(m, inputs, outputs, n, err)
                              : run_static(m, last, inputs, outputs, err);
    pthread_mutex_unlock(&m->lock);
    if (!s && m->batched)
        for (size_t i = 0; i < noutputs; i++)
            set_output(&outputs[i], &last->tensors[last->outputs[i].tensor],
                       last->outputs[i].batched ? n : -1);
    return s;
}
