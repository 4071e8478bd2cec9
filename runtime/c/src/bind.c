/* Zero-copy inputs and outputs (runtime/model.py Model._bindings, _output_bindings): which
 * kernel argument slots a run may point at the caller's buffers. */
#include <string.h>

#include "model.h"

/* `views` as a tensor set when it is rows over exactly `tensor`'s bytes (in-range indices,
 * `tensor` among them, each an arena row at its offset with its size); NULL otherwise. */
static uint8_t *rows_over(mlc_model *m, const mlc_plan *p, const mp_node *views, uint32_t tensor)
{
    if (!views || views->type != MP_ARRAY)
        return NULL;
    uint8_t *set = mlc_zalloc(&m->alloc, p->ntensors + 1);
    const mlc_trow *base = &p->tensors[tensor];
    if (!set)
        return NULL;
    for (uint32_t i = 0; i < views->len; i++) {
        const mp_node *t = &views->v.items[i];
        if (!mp_is_int(t) || t->v.i < 0 || (uint64_t)t->v.i >= p->ntensors)
            return NULL;
        const mlc_trow *row = &p->tensors[t->v.i];
        if (row->kind != T_ARENA || row->ref != base->ref || row->nbytes != base->nbytes)
            return NULL;
        set[t->v.i] = 1;
    }
    return set[tensor] ? set : NULL;
}

/* The kernel argument slots where calls take the tensors of `set` (*out, their count
 * returned); -1 when a copy or a library call uses them, or (`inputs_only`) a kernel takes
 * them past its inputs. */
static long kernel_slots(mlc_model *m, const mlc_plan *p, const uint8_t *set, int inputs_only,
                         void ****out)
{
    void ***slots = NULL;
    long n = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (size_t i = 0; i < p->nprogram; i++) {
            const mlc_instr *in = &p->program[i];
            if (in->op == OP_COPY) {
                if (set[in->target] || set[in->operands[0]])
                    return -1;
                continue;
            }
            for (uint32_t j = 0; j < in->n; j++) {
                if (!set[in->operands[j]])
                    continue;
                if (in->op != OP_KERNEL || (inputs_only && j >= p->kernels[in->target].nin))
                    return -1;
                if (slots)
                    slots[n] = &in->args[j];
                n++;
            }
        }
        if (!pass) {
            slots = mlc_zalloc(&m->alloc, (size_t)(n + 1) * sizeof(void **));
            if (!slots)
                return -1;
        }
    }
    *out = slots;
    return n;
}

/* Which inputs kernels may read where the caller holds them, and which outputs kernels may
 * write straight into the caller's buffer (static, one-plan bundles; the Python runtime's
 * rules, so a damaged views list can only swap equally many arena bytes for the caller's). */
void mlc_plan_bindings(mlc_model *m, mlc_plan *p)
{
    size_t *taken = mlc_zalloc(&m->alloc, (p->ntensors + 1) * sizeof(size_t));
    if (!taken)
        return;
    for (int kind = 0; kind < 2; kind++)
        for (size_t i = 0; i < (kind ? p->noutputs : p->ninputs); i++) {
            const mlc_iorow *io = kind ? &p->outputs[i] : &p->inputs[i];
            uint8_t *seen = mlc_zalloc(&m->alloc, p->ntensors + 1);
            if (!seen)
                return;
            seen[io->tensor] = 1;
            for (uint32_t k = 0; io->views && io->views->type == MP_ARRAY && k < io->views->len; k++) {
                const mp_node *t = &io->views->v.items[k];
                if (mp_is_int(t) && t->v.i >= 0 && (uint64_t)t->v.i < p->ntensors)
                    seen[t->v.i] = 1;
            }
            for (size_t t = 0; t < p->ntensors; t++)
                taken[t] += seen[t];
        }
    for (size_t i = 0; i < p->ninputs; i++) {
        mlc_iorow *io = &p->inputs[i];
        uint8_t *set = rows_over(m, p, io->views, io->tensor);
        int clash = !set;
        for (size_t o = 0; set && o < p->noutputs; o++)
            clash |= set[p->outputs[o].tensor];
        long n = clash ? -1 : kernel_slots(m, p, set, 1, &io->slots);
        io->bindable = n >= 0;
        io->nslots = n > 0 ? (size_t)n : 0;
    }
    for (size_t i = 0; i < p->noutputs; i++) {
        mlc_iorow *io = &p->outputs[i];
        uint8_t *set = rows_over(m, p, io->views, io->tensor);
        int ok = set != NULL;
        for (size_t t = 0; ok && t < p->ntensors; t++)
            if (set[t] && taken[t] != 1)
                ok = 0;
        long n = ok ? kernel_slots(m, p, set, 0, &io->slots) : -1;
        io->bindable = n > 0;
        io->nslots = n > 0 ? (size_t)n : 0;
    }
}

