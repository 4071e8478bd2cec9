/* Format 1.8's counted loops, checked at load (runtime/vm_loops.py is the reference): every
 * LOOP and its NEXT name each other, loops nest, no jump enters or leaves a loop's body; then
 * their targets become instruction indices and the plan gets the per-loop counters the run
 * keeps (run.c: jump_next), never in a tensor. */
#include <string.h>

#include "model.h"

/* Whether tensor t of the plan is one element (shape [] or [1]) of dtype d. */
int mlc_one_element(const mlc_plan *p, int32_t t, mlc_dtype d)
{
    if (t < 0 || (size_t)t >= p->ntensors)
        return 0;
    const mlc_trow *row = &p->tensors[t];
    if (row->dtype != d)
        return 0;
    if (!row->rec)   /* a static plan's row */
        return row->ndim == 0 || (row->ndim == 1 && row->shape[0] == 1);
    return row->rec->len == 0 || (row->rec->len == 1 && mp_is_int(&row->rec->v.items[0])
                                  && row->rec->v.items[0].v.i == 1);
}

/* Format 1.8's loops (runtime/vm.py: _link_loops): every LOOP's end word follows a NEXT that
 * names it, every NEXT names a LOOP that ends right after it; loops nest; a jump's target lies
 * in the body of the innermost loop around the jump (or is that loop's NEXT); then the targets
 * become instruction indices (LOOP: the one after its NEXT; NEXT: its LOOP). */
mlc_status mlc_link_loops(mlc_model *m, mlc_plan *p, const int32_t *w, size_t nw,
                             const int64_t *start_of, mlc_error *err)
{
    size_t n = p->nprogram;
    int64_t *inner = mlc_zalloc(&m->alloc, (n + 1) * sizeof(int64_t));
    int64_t *stack = mlc_zalloc(&m->alloc, (n + 1) * sizeof(int64_t));
    int64_t *pair = mlc_zalloc(&m->alloc, (n + 1) * sizeof(int64_t));   /* LOOP -> NEXT */
    size_t *word = mlc_zalloc(&m->alloc, (n + 1) * sizeof(size_t));
    if (!inner || !stack || !pair || !word)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (size_t pc = 0; pc <= nw; pc++)
        if (start_of[pc] >= 0)
            word[start_of[pc]] = pc;
    for (size_t i = 0; i < n; i++) {
        const mlc_instr *in = &p->program[i];
        size_t arg = in->target;   /* still a word */
        if (in->op == OP_LOOP) {
            if (arg < 3 || start_of[arg] < 0 || start_of[arg - 3] < 0
                || p->program[start_of[arg - 3]].op != OP_NEXT || (size_t)w[arg - 1] != word[i])
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: LOOP's "
                                "end is not right after a NEXT that names it", m->name, word[i]);
            pair[i] = start_of[arg - 3];
        } else if (in->op == OP_NEXT) {
            if (start_of[arg] < 0 || p->program[start_of[arg]].op != OP_LOOP
                || (size_t)w[arg + 4] != word[i] + 3)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: NEXT "
                                "names no LOOP that ends right after it", m->name, word[i]);
        }
    }
    size_t depth = 0;
    for (size_t i = 0; i <= n; i++) {
        while (depth && pair[stack[depth - 1]] < (int64_t)i)
            depth--;
        if (i < n && p->program[i].op == OP_NEXT && (!depth || pair[stack[depth - 1]] != (int64_t)i))
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: loops "
                            "overlap without nesting", m->name, word[i]);
        inner[i] = depth ? stack[depth - 1] : -1;
        if (i < n && p->program[i].op == OP_LOOP)
            stack[depth++] = (int64_t)i;
    }
    for (size_t i = 0; i < n; i++) {
        const mlc_instr *in = &p->program[i];
        if ((in->op == OP_JUMP || in->op == OP_JUMP_UNLESS) && inner[in->target] != inner[i])
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: a jump "
                            "enters or leaves a loop's body", m->name, word[i]);
    }
    for (size_t i = 0; i < n; i++) {
        mlc_instr *in = &p->program[i];
        if (in->op == OP_LOOP) {
            in->target = (uint32_t)(pair[i] + 1);
            p->program[pair[i]].target = (uint32_t)i;
        }
    }
    p->loop_iter = mlc_zalloc(&m->alloc, (n + 1) * sizeof(int64_t));
    p->loop_limit = mlc_zalloc(&m->alloc, (n + 1) * sizeof(int64_t));
    if (!p->loop_iter || !p->loop_limit)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    return MLC_OK;
}

