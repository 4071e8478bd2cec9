/* Format 1.8's counted loops, checked at load (runtime/vm_loops.py is the reference): every
 * LOOP and its NEXT name each other, loops nest, no jump enters or leaves a loop's body; then
 * their targets become instruction indices and the plan gets the per-loop counters the run
 * keeps (run.c: jump_next), never in a tensor. Format 1.9's row stores: APPEND checked at load
 * and run here (runtime/vm_loops.py: RowStore). */
#include <stdlib.h>
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


/* ---- format 1.9: row stores (a Loop's scan outputs with no bound at export) ---- */

/* Whether two dim records are the same record (depth-limited: records are shallow). */
static int same_record(const mp_node *a, const mp_node *b, int depth)
{
    if (depth > MP_MAX_DEPTH || a->type != b->type || a->len != b->len)
        return 0;
    switch (a->type) {
    case MP_INT:
    case MP_BOOL:
        return a->v.i == b->v.i;
    case MP_UINT:
        return a->v.u == b->v.u;
    case MP_STR:
    case MP_BIN:
        return !a->len || !memcmp(a->v.p, b->v.p, a->len);
    case MP_ARRAY:
        for (uint32_t i = 0; i < a->len; i++)
            if (!same_record(&a->v.items[i], &b->v.items[i], depth + 1))
                return 0;
        return 1;
    case MP_NIL:
        return 1;
    default:
        return 0;
    }
}

/* The axis of a STORE row's count: its dims before it are 1s (format 1.10; 0 for 1.9's). */
int mlc_store_lead(const mlc_trow *row)
{
    int lead = 0;
    while (row->rec && (uint32_t)lead < row->rec->len && mp_is_int(&row->rec->v.items[lead])
           && row->rec->v.items[lead].v.i == 1)
        lead++;
    return lead;
}

/* 0: APPEND s, r is not valid; 1: r is one row (its dims the STORE's without the count's, format
 * 1.9); 2: r is rows (format 1.10: the STORE's rank, its dims but at the count's axis). */
int mlc_append_ok(const mlc_plan *p, int32_t s, int32_t r)
{
    const mlc_trow *store = &p->tensors[s], *row = &p->tensors[r];
    if (!p->sym || store->kind != T_STORE || row->kind != T_ARENA || store->dtype != row->dtype
        || !store->rec || !row->rec || !store->rec->len)
        return 0;
    uint32_t lead = (uint32_t)mlc_store_lead(store);
    if (lead >= store->rec->len)
        return 0;
    if (store->rec->len == row->rec->len + 1) {
        for (uint32_t d = 0, e = 0; d < store->rec->len; d++)
            if (d != lead && !same_record(&store->rec->v.items[d], &row->rec->v.items[e++], 0))
                return 0;
        return 1;
    }
    if (store->rec->len != row->rec->len)
        return 0;
    for (uint32_t d = 0; d < store->rec->len; d++)
        if (d != lead && !same_record(&store->rec->v.items[d], &row->rec->v.items[d], 0))
            return 0;
    return 2;
}

static int grows_names(const mlc_plan *p, size_t t)
{
    for (uint32_t i = 0; p->grows && i < p->grows->len; i++)
        if (p->grows->v.items[i].v.i == (int64_t)t)
            return 1;
    return 0;
}

mlc_status mlc_link_stores(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    size_t n = 0;
    for (size_t t = 0; t < p->ntensors; t++)
        n += p->tensors[t].kind == T_STORE;
    if ((int64_t)n != (p->has_stores ? p->nstores_declared : 0))
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: the vm record's stores count "
                        "is not its %zu STORE rows", m->name, n);
    for (uint32_t i = 0; p->grows && i < p->grows->len; i++) {   /* format 1.10 */
        int64_t t = p->grows->v.items[i].v.i;
        int dup = 0;
        for (uint32_t j = 0; j < i; j++)
            dup |= p->grows->v.items[j].v.i == t;
        if (dup || p->tensors[t].kind != T_STORE)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: the vm record's grows must "
                            "name distinct STORE rows", m->name);
    }
    int64_t depth = 0;   /* loops around the instruction (they nest: mlc_link_loops checked) */
    for (size_t i = 0; i < p->nprogram; i++) {   /* only APPEND names a STORE row */
        const mlc_instr *in = &p->program[i];
        depth += (in->op == OP_LOOP) - (in->op == OP_NEXT);
        int bad = in->op == OP_COPY && p->tensors[in->target].kind == T_STORE;
        for (uint32_t j = 0; j < in->n; j++)
            bad |= p->tensors[in->operands[j]].kind == T_STORE;
        if (bad)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: a STORE row is named by an "
                            "instruction other than APPEND", m->name);
        if (in->op == OP_APPEND && (depth <= 0 || mlc_append_ok(p, (int32_t)in->target,
                                                                in->operands[0]) == 2)
            && !grows_names(p, in->target))
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: APPEND %u, %d: only a "
                            "STORE row of the vm record's grows takes several rows at once or "
                            "rows before its loop", m->name, in->target, in->operands[0]);
    }
    if (!n)
        return MLC_OK;
    p->stores = mlc_zalloc(&m->alloc, n * sizeof(mlc_store));
    p->store_of = mlc_zalloc(&m->alloc, p->ntensors * sizeof(int32_t));
    if (!p->stores || !p->store_of)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (size_t t = 0; t < p->ntensors; t++) {
        p->store_of[t] = -1;
        const mlc_trow *row = &p->tensors[t];
        if (row->kind != T_STORE)
            continue;
        int grown = grows_names(p, t);
        int lead = grown ? mlc_store_lead(row) : 0;
        int var = row->rec && (uint32_t)lead < row->rec->len
                  ? mlc_sym_var(p, &row->rec->v.items[lead]) : -1;
        int counted = 0;
        for (size_t d = 0; var >= 0 && d < p->sym->ndynamic; d++)
            counted |= p->sym->dyn_var[d] == var;
        if (!counted)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: STORE row %zu's first dim "
                            "must be a size variable bound at run time", m->name, t);
        p->store_of[t] = (int32_t)p->nstores;
        p->stores[p->nstores++] = (mlc_store){(uint32_t)t, var, NULL, 0, 0, 0, lead, grown};
    }
    return MLC_OK;
}

mlc_status mlc_store_append(const mlc_model *m, mlc_plan *p, const mlc_instr *in,
                            mlc_error *err)
{
    mlc_store *st = &p->stores[p->store_of[in->target]];
    int32_t r = in->operands[0];
    uint64_t size = p->sym->tbytes[r], end;
    int64_t cap = p->sym->limits[st->var], rows = 1;
    const mlc_trow *row = &p->tensors[r];
    if (row->rec->len == p->tensors[in->target].rec->len) {   /* format 1.10: rows */
        uint32_t rank = row->rec->len;
        const int64_t *dims = p->sym->tdims + (size_t)r * MLC_MAX_DIMS;
        uint64_t one;
        /* its count along the axis as the kernels counted it this iteration (the tensor is
           planned at its bound: the rows are its leading bytes) */
        if (mlc_sym_eval(p, &row->rec->v.items[st->lead], p->sym->sizes, &rows) || rows < 0
            || mlc_nbytes(dims + st->lead + 1, (int)(rank - (uint32_t)st->lead - 1), row->dtype,
                          &one)
            || __builtin_mul_overflow((uint64_t)rows, one, &size) || size > p->sym->tbytes[r])
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bundle header: APPEND appends more rows "
                            "than its tensor holds", m->name);
        st->row_bytes = one;
    } else if (st->count == 0) {
        st->row_bytes = size;
    }
    uint64_t have = (uint64_t)st->count * st->row_bytes;
    if (rows > cap - st->count || __builtin_add_overflow(have, size, &end)
        || end > MLC_STORE_MAX_BYTES)
        return mlc_fail(err, MLC_ERR_INPUT, "%s: %s its cap (%lld rows, %llu bytes): the loop "
                        "runs longer than the model can return", m->name,
                        st->grown ? "a carried value of one of the model's Loop nodes would grow "
                        "past" : "a scan output of one of the model's Loop nodes would pass",
                        (long long)cap, (unsigned long long)MLC_STORE_MAX_BYTES);
    if (end > st->capacity) {   /* doubling: each row is copied O(1) times */
        uint64_t grown = st->capacity * 2;
        if (grown < end)
            grown = end;
        if (grown < 16 * st->row_bytes)
            grown = 16 * st->row_bytes;
        if (grown > MLC_STORE_MAX_BYTES)
            grown = MLC_STORE_MAX_BYTES;
        uint8_t *data = realloc(st->data, (size_t)grown);
        if (!data)
            return mlc_fail(err, MLC_ERR_INTERNAL, "%s: out of memory for a loop's rows (%llu "
                            "bytes)", m->name, (unsigned long long)grown);
        st->data = data;
        st->capacity = grown;
    }
    if (size)
        memcpy(st->data + (size_t)have, p->addr[r], (size_t)size);
    st->count += rows;
    return MLC_OK;
}

void mlc_stores_free(mlc_plan *p)
{
    for (size_t i = 0; i < p->nstores; i++) {
        free(p->stores[i].data);
        p->stores[i].data = NULL;
        p->stores[i].capacity = 0;
    }
}
