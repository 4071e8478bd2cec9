/* Opening a bundle and running it: the order of runtime/model.py. Read and hash the file,
 * validate the header, choose a code variant this CPU runs (refusing before any code is mapped),
 * resolve library functions, map the object code, decode and check the bytecode, then lay the
 * tensors over one arena and the mapped constants. A run copies the inputs into the arena, runs
 * the program (the bundle's native step loop when it has one), and copies the outputs out. */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"


#define MAX_OPERANDS 4096

void mlc_options_init(mlc_options *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
}

const char *mlc_version(void)
{
    return "0.1 (format 1.8, abi 1)";
}

static mlc_status decode(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    if (p->bytecode.size % 4)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: bytecode length is not a multiple of 4",
                        m->name);
    size_t nw = (size_t)(p->bytecode.size / 4);
    int32_t *w = mlc_zalloc(&m->alloc, (nw + 1) * 4);
    if (!w)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    memcpy(w, m->data + m->data_start + p->bytecode.off, nw * 4);   /* little-endian hosts */
    /* each word's instruction index, for the jumps' targets (-1: inside an instruction) */
    int64_t *start_of = mlc_zalloc(&m->alloc, (nw + 1) * sizeof(int64_t));
    if (!start_of)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i <= nw; i++)
        start_of[i] = -1;
    /* count, then fill */
    for (int pass = 0; pass < 2; pass++) {
        size_t pc = 0, k = 0;
        while (pc < nw) {
            int32_t op = w[pc];
            const char *why = NULL;
            start_of[pc] = (int64_t)k;
            if (op == OP_JUMP || op == OP_TRAP || op == OP_JUMP_UNLESS) {
                size_t len = op == OP_JUMP_UNLESS ? 3 : 2;
                int32_t arg = 0;
                if (pc + len > nw)
                    why = "truncated JUMP, JUMP_UNLESS or TRAP";
                else if (op == OP_TRAP) {
                    if (w[pc + 1] < 0 || w[pc + 1] > 2)   /* 2: format 1.9 */
                        why = "unknown TRAP reason";
                } else {
                    arg = w[pc + len - 1];
                    if (arg < 0 || (size_t)arg <= pc || (size_t)arg > nw)
                        why = "jump target outside the bytecode or not forward";
                    else if (op == OP_JUMP_UNLESS) {
                        int32_t t = w[pc + 1];
                        if (t < 0 || (size_t)t >= p->ntensors)
                            why = "tensor index out of range";
                        else if (!mlc_one_element(p, t, MLC_BOOL))
                            why = "JUMP_UNLESS must test one bool";
                    }
                }
                if (why)
                    return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: %s",
                                    m->name, pc, why);
                if (pass)   /* the target word for now: an instruction index below */
                    p->program[k] = (mlc_instr){op, (uint32_t)(op == OP_TRAP ? w[pc + 1] : arg),
                                                op == OP_JUMP_UNLESS, &w[pc + 1], NULL, NULL};
                p->jumps |= op != OP_TRAP;
                k++;
                pc += len;
                continue;
            }
            if (op == OP_LOOP || op == OP_NEXT) {
                size_t len = op == OP_LOOP ? 5 : 3;
                int32_t arg = 0;
                if (pc + len > nw)
                    why = "truncated LOOP or NEXT";
                else {
                    arg = w[pc + len - 1];
                    for (size_t j = 1; j + 1 < len; j++)
                        if (w[pc + j] < 0 || (size_t)w[pc + j] >= p->ntensors)
                            why = "tensor index out of range";
                    if (why)
                        ;
                    else if (op == OP_LOOP && (arg < 0 || (size_t)arg < pc + len + 3
                                               || (size_t)arg > nw))
                        why = "LOOP's end outside the bytecode or not after it";
                    else if (op == OP_NEXT && (arg < 0 || (size_t)arg >= pc))
                        why = "NEXT's head is not before it";
                    else if (op == OP_LOOP && !(mlc_one_element(p, w[pc + 1], MLC_INT64)
                                                && mlc_one_element(p, w[pc + 2], MLC_BOOL)
                                                && mlc_one_element(p, w[pc + 3], MLC_INT64)
                                                && p->tensors[w[pc + 3]].kind == T_ARENA))
                        why = "LOOP must read one int64 count and one bool and write one int64 "
                              "in the arena";
                    else if (op == OP_NEXT && !mlc_one_element(p, w[pc + 1], MLC_BOOL))
                        why = "NEXT must test one bool";
                }
                if (why)
                    return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: %s",
                                    m->name, pc, why);
                if (pass)   /* the word for now: an instruction index in link_loops */
                    p->program[k] = (mlc_instr){op, (uint32_t)arg, (uint32_t)(len - 2),
                                                &w[pc + 1], NULL, NULL};
                p->jumps = 1;
                p->loops = 1;
                k++;
                pc += len;
                continue;
            }
            if (op == OP_COPY) {
                if (pc + 3 > nw)
                    why = "truncated COPY";
                else if (w[pc + 1] < 0 || (size_t)w[pc + 1] >= p->ntensors || w[pc + 2] < 0
                         || (size_t)w[pc + 2] >= p->ntensors)
                    why = "tensor index out of range";
                if (why)
                    return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: %s",
                                    m->name, pc, why);
                if (pass)
                    p->program[k] = (mlc_instr){OP_COPY, (uint32_t)w[pc + 1], 1, &w[pc + 2],
                                                NULL, NULL};
                k++;
                pc += 3;
                continue;
            }
            if (op == OP_APPEND) {   /* format 1.9: s, a STORE row; r, an arena row */
                if (pc + 3 > nw)
                    why = "truncated APPEND";
                else if (w[pc + 1] < 0 || (size_t)w[pc + 1] >= p->ntensors || w[pc + 2] < 0
                         || (size_t)w[pc + 2] >= p->ntensors)
                    why = "tensor index out of range";
                else if (!mlc_append_ok(p, w[pc + 1], w[pc + 2]))
                    why = "APPEND must append an arena row to a STORE row of its dtype and row "
                          "shape";
                if (why)
                    return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: %s",
                                    m->name, pc, why);
                if (pass)
                    p->program[k] = (mlc_instr){OP_APPEND, (uint32_t)w[pc + 1], 1, &w[pc + 2],
                                                NULL, NULL};
                k++;
                pc += 3;
                continue;
            }
            if (op == OP_BIND) {
                if (pc + 3 > nw)
                    why = "truncated BIND_SIZE";
                else if (!p->sym || w[pc + 1] < 0 || (size_t)w[pc + 1] >= p->sym->nvars
                         || w[pc + 2] < 0 || (size_t)w[pc + 2] >= p->ntensors)
                    why = "BIND_SIZE names no size variable or tensor of this plan";
                else {
                    const mlc_trow *t = &p->tensors[w[pc + 2]];
                    int counted = 0;
                    for (size_t d = 0; d < p->sym->ndynamic; d++)
                        counted |= p->sym->dyn_var[d] == w[pc + 1];
                    if (!counted || t->dtype != MLC_INT64 || t->rec->len > 1
                        || (t->rec->len == 1 && !(mp_is_int(&t->rec->v.items[0])
                                                  && t->rec->v.items[0].v.i == 1)))
                        why = "BIND_SIZE must bind a run-time size from one int64 element";
                }
                if (why)
                    return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: %s",
                                    m->name, pc, why);
                if (pass)
                    p->program[k] = (mlc_instr){OP_BIND, (uint32_t)w[pc + 1], 1, &w[pc + 2],
                                                NULL, NULL};
                k++;
                pc += 3;
                continue;
            }
            if (op != OP_KERNEL && op != OP_LIB)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: unknown "
                                "opcode %d", m->name, pc, op);
            if (pc + 3 > nw)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: "
                                "truncated call", m->name, pc);
            int32_t target = w[pc + 1], n = w[pc + 2];
            size_t limit = op == OP_KERNEL ? p->nkernels : p->nsites;
            if (target < 0 || (size_t)target >= limit)
                why = "call target out of range";
            else if (n <= 0 || n > MAX_OPERANDS || pc + 3 + (size_t)n > nw)
                why = "bad operand count";
            else
                for (int32_t i = 0; i < n; i++)
                    if (w[pc + 3 + i] < 0 || (size_t)w[pc + 3 + i] >= p->ntensors)
                        why = "tensor index out of range";
            if (why)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %zu: %s",
                                m->name, pc, why);
            if (pass)
                p->program[k] = (mlc_instr){op, (uint32_t)target, (uint32_t)n, &w[pc + 3], NULL,
                                            NULL};
            k++;
            pc += 3 + (size_t)n;
        }
        start_of[nw] = (int64_t)k;
        if (!pass) {
            p->nprogram = k;
            p->program = mlc_zalloc(&m->alloc, (k + 1) * sizeof(mlc_instr));
            if (!p->program)
                return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        }
    }
    for (size_t i = 0; i < p->nprogram; i++) {   /* jump targets: words to instructions */
        mlc_instr *in = &p->program[i];
        if (in->op != OP_JUMP && in->op != OP_JUMP_UNLESS)
            continue;
        if (start_of[in->target] < 0)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: invalid bytecode at word %u: a jump "
                            "lands inside an instruction", m->name, in->target);
        in->target = (uint32_t)start_of[in->target];
    }
    if (p->loops) {
        mlc_status s = mlc_link_loops(m, p, w, nw, start_of, err);
        if (s)
            return s;
    }
    mlc_status st = mlc_link_stores(m, p, err);
    if (st)
        return st;
    for (size_t i = 0; i < p->nprogram; i++) {
        const mlc_instr *in = &p->program[i];
        if (in->op != OP_KERNEL)
            continue;
        const mlc_krow *k = &p->kernels[in->target];
        size_t expected = (size_t)k->nin + k->nout + (k->workspace || k->workspace_rec ? 1 : 0)
                          + (k->symbolic ? 1 : 0);
        if (in->n != expected)
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: kernel %s takes %zu tensors, "
                            "bytecode passes %u", k->name, expected, in->n);
        if (k->symbolic && p->tensors[in->operands[in->n - 1]].kind != T_SIZES)
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: kernel %s is not passed the "
                            "size variables", k->name);
        if (!p->sym && k->workspace && p->tensors[in->operands[in->n - 1]].nbytes < k->workspace)
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: kernel %s workspace too small",
                            k->name);
    }
    return MLC_OK;
}

static mlc_status resolve_sites(mlc_model *m, const mlc_options *o, mlc_error *err)
{
    char missing[400] = "";
    for (size_t p = 0; p < m->nplans; p++)
        for (size_t i = 0; i < m->plans[p].nsites; i++) {
            mlc_site *s = &m->plans[p].sites[i];
            for (size_t j = 0; o && j < o->library_count; j++)
                if (o->library[j].name && !strcmp(o->library[j].name, s->func) && o->library[j].fn) {
                    s->fn = o->library[j].fn;
                    s->user = o->library[j].user;
                    break;
                }
            if (!s->fn)
                s->fn = mlc_builtin_library(s->func);
            if (!s->fn) {
                char needle[140];
                snprintf(needle, sizeof needle, "%.120s, ", s->func);
                if (!strstr(missing, needle) && strlen(missing) + strlen(needle) < sizeof missing)
                    strcat(missing, needle);
            }
        }
    if (missing[0]) {
        missing[strlen(missing) - 2] = 0;
        return mlc_fail(err, MLC_ERR_LIBRARY, "%s calls library function(s) %s that this "
                        "process does not provide: register them in mlc_options.library",
                        m->name, missing);
    }
    return MLC_OK;
}

static mlc_status map_code(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    const mlc_variant *v = &p->code[p->chosen];
    char arch[16];
    snprintf(arch, sizeof arch, "%s", strcmp(v->arch, "arm64") ? v->arch : "aarch64");
    if (!strcmp(arch, "amd64") || !strcmp(arch, "x64"))
        snprintf(arch, sizeof arch, "x86_64");
    mlc_error e;
    if (mlc_elf_load(m->data + m->data_start + v->object.off, (size_t)v->object.size, arch,
                     &m->alloc, &p->image, &e))
        return mlc_fail(err, e.status, "%s: %s", m->name, e.message);
    p->kernel_addr = mlc_zalloc(&m->alloc, (p->nkernels + 1) * sizeof(uintptr_t));
    if (!p->kernel_addr)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < p->nkernels; i++) {
        p->kernel_addr[i] = mlc_image_symbol(&p->image, p->kernels[i].symbol);
        if (!p->kernel_addr[i])
            return mlc_fail(err, MLC_ERR_CODE, "%s: object code defines no global symbol '%.80s'",
                            m->name, p->kernels[i].symbol);
    }
    p->pool.worker = mlc_image_symbol(&p->image, "mlcpack_pool_worker");
    p->pool.run = mlc_image_symbol(&p->image, "mlcpack_pool_run");
    p->pool.join = mlc_image_symbol(&p->image, "mlcpack_pool_join");
    p->has_pool = p->pool.worker && p->pool.run && p->pool.join;
    p->pool.steps = p->has_pool ? mlc_image_symbol(&p->image, "mlcpack_pool_steps") : 0;
    p->pool.ranges = p->has_pool && mlc_image_symbol(&p->image, "mlcpack_pool_ranges") != 0;
    return MLC_OK;
}

/* Tensor addresses over the arena and the constants, the kernels' void*[], the library calls'
 * tensors, the step loop's table and segments, the worker threads. */
static mlc_status prepare(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    p->addr = mlc_zalloc(&m->alloc, (p->ntensors + 1) * sizeof(uint8_t *));
    if (!p->addr)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    mlc_status st = p->sym ? mlc_sym_alloc(m, p, err) : MLC_OK;
    if (st)
        return st;
    for (size_t i = 0; i < p->ntensors && !p->sym; i++) {
        const mlc_trow *t = &p->tensors[i];
        if (t->kind == T_ARENA && t->ref <= p->arena_bytes && t->nbytes <= p->arena_bytes - t->ref)
            p->addr[i] = m->arena + t->ref;
        else if (t->kind == T_CONST && t->ref < m->nconstants
                 && m->constant_bytes[t->ref] == t->nbytes
                 && mlc_storage(m->constant_dtypes[t->ref]) == mlc_storage(t->dtype))
            p->addr[i] = (uint8_t *)m->constant_addr[t->ref];
        else
            return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: tensor %zu lies outside its "
                            "storage", i);
    }
    for (int kind = 0; kind < 2 && !p->sym; kind++) {
        size_t n = kind ? p->noutputs : p->ninputs;
        for (size_t i = 0; i < n; i++) {
            const mlc_iorow *io = kind ? &p->outputs[i] : &p->inputs[i];
            const mlc_trow *t = &p->tensors[io->tensor];
            if (t->nbytes != io->nbytes || mlc_storage(t->dtype) != mlc_storage(io->dtype)
                || (kind == 0 && t->kind != T_ARENA))
                return mlc_fail(err, MLC_ERR_BUNDLE, "bundle header: %s '%s' does not match its "
                                "tensor row", kind ? "output" : "input", io->name);
        }
    }
    size_t ncalls = 0;
    int any_parallel = 0;
    for (size_t i = 0; i < p->nprogram; i++) {
        mlc_instr *in = &p->program[i];
        if (in->op == OP_KERNEL) {
            in->args = mlc_zalloc(&m->alloc, in->n * sizeof(void *));
            if (!in->args)
                return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
            for (uint32_t j = 0; j < in->n; j++)
                in->args[j] = p->addr[in->operands[j]];
            ncalls++;
            any_parallel |= p->kernels[in->target].parallel;
        } else if (in->op == OP_LIB) {
            in->tensors = mlc_zalloc(&m->alloc, in->n * sizeof(mlc_tensor));
            if (!in->tensors)
                return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
            for (uint32_t j = 0; j < in->n; j++) {
                const mlc_trow *t = &p->tensors[in->operands[j]];
                mlc_tensor *x = &in->tensors[j];
                x->dtype = t->dtype;
                if (p->sym)
                    continue;   /* set per shape (mlc_sym_plan) */
                x->data = p->addr[in->operands[j]];
                x->nbytes = (size_t)t->nbytes;
                x->dtype = t->dtype;
                x->ndim = t->ndim;
                memcpy(x->dims, t->shape, sizeof x->dims);
            }
        } else if (in->op == OP_COPY && !p->sym) {
            const mlc_trow *src = &p->tensors[in->target], *dst = &p->tensors[in->operands[0]];
            if (src->nbytes != dst->nbytes || mlc_storage(src->dtype) != mlc_storage(dst->dtype))
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: a COPY instruction joins tensors of "
                                "different sizes or dtypes", m->name);
            if (dst->kind != T_ARENA)
                return mlc_fail(err, MLC_ERR_BUNDLE, "%s: a COPY instruction writes a constant",
                                m->name);
        }
    }
    if (!p->sym && !m->batched && m->plans == p)
        mlc_plan_bindings(m, p);
    if (m->threads > 1 && any_parallel) {
        mlc_status s = mlc_threads_start(m->threads - 1, p->has_pool ? &p->pool : NULL,
                                         &p->threads, err);
        if (s)
            return s;
    }
    if (!p->pool.steps || !ncalls)
        return MLC_OK;
    p->ncalls = ncalls;
    p->table = mlc_zalloc(&m->alloc, 3 * ncalls * sizeof(uint64_t));
    p->segments = mlc_zalloc(&m->alloc, (p->nprogram + 1) * sizeof(mlc_segment));
    if (!p->table || !p->segments)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    uint8_t *is_target = NULL;   /* with jumps: a target starts a segment of its own */
    if (p->jumps) {
        is_target = mlc_zalloc(&m->alloc, p->nprogram + 1);
        p->segment_at = mlc_zalloc(&m->alloc, (p->nprogram + 1) * sizeof(size_t));
        if (!is_target || !p->segment_at)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (size_t i = 0; i < p->nprogram; i++)
            if (p->program[i].op == OP_JUMP || p->program[i].op == OP_JUMP_UNLESS
                || p->program[i].op == OP_LOOP)
                is_target[p->program[i].target] = 1;
            else if (p->program[i].op == OP_NEXT)   /* its back edge: the body's first */
                is_target[p->program[i].target + 1] = 1;
    }
    size_t k = 0;
    for (size_t i = 0; i < p->nprogram; i++) {
        mlc_instr *in = &p->program[i];
        if (p->segment_at)
            p->segment_at[i] = p->nsegments;
        if (in->op == OP_KERNEL) {
            p->table[3 * k] = p->kernel_addr[in->target];
            p->table[3 * k + 1] = (uint64_t)(uintptr_t)in->args;
            p->table[3 * k + 2] = p->kernels[in->target].parallel && p->threads
                                  ? (uint64_t)mlc_task_count(m->threads,
                                                             p->kernels[in->target].macs,
                                                             p->pool.ranges)
                                  : 0;
            if (p->nsegments && p->segments[p->nsegments - 1].start >= 0
                && p->segments[p->nsegments - 1].end == (int64_t)k
                && !(is_target && is_target[i]))
                p->segments[p->nsegments - 1].end = (int64_t)k + 1;
            else
                p->segments[p->nsegments++] = (mlc_segment){(int64_t)k, (int64_t)k + 1};
            k++;
        } else {
            p->segments[p->nsegments++] = (mlc_segment){-1 - (int64_t)i, 0};
        }
    }
    if (p->segment_at)
        p->segment_at[p->nprogram] = p->nsegments;
    return MLC_OK;
}

/* The bundle's plans, then a symbolic bundle's specialized static plans. */
static mlc_plan *plan_at(mlc_model *m, size_t i)
{
    return i < m->nplans ? &m->plans[i] : &m->specialized[i - m->nplans];
}

static mlc_status open_common(mlc_model *m, const mlc_options *o, mlc_error *err)
{
    mlc_status s;
    if ((s = mlc_read_file_layout(m, !(o && o->skip_digest), err)))
        return s;
    if ((s = mlc_check_signature(m, o, err)))   /* before anything in the bundle is used */
        return s;
    if ((s = mlc_parse_header(m, err)))
        return s;
    int threads = o && o->threads > 1 ? o->threads : 1;
    m->threads = threads > MLC_MAX_THREADS ? MLC_MAX_THREADS : threads;
    if ((s = mlc_cpu_host(&m->cpu, o ? o->cpu_arch : NULL, o ? o->cpu_features : NULL,
                          &m->alloc, err)))
        return s;
    /* CPU features are checked before any code is mapped (every plan's code). */
    size_t nall = m->nplans + m->nspecialized;
    for (size_t p = 0; p < nall; p++) {
        mlc_plan *plan = plan_at(m, p);
        mlc_variant_req *req = mlc_zalloc(&m->alloc, plan->ncode * sizeof *req);
        if (!req)
            return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        for (size_t i = 0; i < plan->ncode; i++)
            req[i] = (mlc_variant_req){plan->code[i].arch, plan->code[i].level,
                                       plan->code[i].features, plan->code[i].nfeatures};
        plan->chosen = mlc_cpu_pick(&m->cpu, req, plan->ncode, m->name, err);
        if (plan->chosen < 0)
            return MLC_ERR_CPU;
    }
    if ((s = resolve_sites(m, o, err)))   /* before any code is mapped too */
        return s;
    for (size_t p = 0; p < nall; p++) {
        mlc_plan *plan = plan_at(m, p);
        if ((s = map_code(m, plan, err)) || (s = decode(m, plan, err)))
            return s;
        if (!plan->sym && plan->arena_bytes > m->arena_bytes)
            m->arena_bytes = plan->arena_bytes;
    }
    /* zeroed pages from the kernel, touched only where the plan writes (as numpy's calloc) */
    size_t arena_size = (size_t)m->arena_bytes + 64;
    void *arena = m->arena_bytes > SIZE_MAX / 2 ? MAP_FAILED
                  : mmap(NULL, arena_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
    if (arena == MAP_FAILED)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: its memory plan asks for a %llu-byte arena, "
                        "which cannot be allocated here", m->name,
                        (unsigned long long)m->arena_bytes);
    m->arena_raw = arena;
    m->arena_size = arena_size;
    m->arena = m->arena_raw;
    for (size_t p = 0; p < nall; p++)
        if ((s = prepare(m, plan_at(m, p), err)))
            return s;
    if (pthread_mutex_init(&m->lock, NULL))
        return mlc_fail(err, MLC_ERR_INTERNAL, "cannot create a mutex");
    m->lock_ready = 1;
    return MLC_OK;
}

/* open_common, then the model handed out, or closed on failure */
static mlc_status open_checked(mlc_model *m, const mlc_options *o, mlc_model **out,
                               mlc_error *err)
{
    mlc_status s = open_common(m, o, err);
    if (s) {
        mlc_close(m);
        return s;
    }
    *out = m;
    return MLC_OK;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

mlc_status mlc_open_memory(const void *data, size_t size, const mlc_options *o,
                           mlc_model **out, mlc_error *err)
{
    if (!out)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_open_memory: model must not be NULL");
    *out = NULL;
    if (!data && size)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_open_memory: data is NULL");
    if ((uintptr_t)data % 64)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_open_memory: the bundle's bytes must start on "
                        "a 64-byte boundary (the payloads are 64-byte aligned)");
    mlc_model *m = calloc(1, sizeof *m);
    if (!m)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    snprintf(m->name, sizeof m->name, "the bundle");
    m->data = data;
    m->size = size;
    return open_checked(m, o, out, err);
}

mlc_status mlc_open_file(const char *path, const mlc_options *o, mlc_model **out,
                         mlc_error *err)
{
    if (!out || !path)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_open_file: path and model must not be NULL");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: no such file", path);
        if (e == EACCES)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: permission denied", path);
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s cannot be read: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s cannot be read: %s", path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s is a directory, not a bundle", path);
    }
    size_t size = (size_t)st.st_size;
    if (size < 60) {
        close(fd);
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s is too small to be an mlcpack bundle (%zu "
                        "bytes)", base_name(path), size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s cannot be read: %s", path, strerror(errno));
    mlc_model *m = calloc(1, sizeof *m);
    if (!m) {
        munmap(map, size);
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    }
    snprintf(m->name, sizeof m->name, "%s", base_name(path));
    m->data = map;
    m->size = size;
    m->mapping = map;
    m->mapping_size = size;
    return open_checked(m, o, out, err);
}

void mlc_close(mlc_model *m)
{
    if (!m)
        return;
    for (size_t p = 0; p < m->nplans + m->nspecialized; p++) {
        mlc_plan *plan = plan_at(m, p);
        mlc_threads_stop(plan->threads);
        mlc_elf_unload(&plan->image);
        mlc_sym_free(plan);
    }
    if (m->lock_ready)
        pthread_mutex_destroy(&m->lock);
    if (m->arena_raw)
        munmap(m->arena_raw, m->arena_size);
    if (m->mapping)
        munmap(m->mapping, m->mapping_size);
    mlc_alloc_free(&m->alloc);
    free(m);
}

/* ---- specs ---- */

size_t mlc_input_count(const mlc_model *m)
{
    return m ? m->plans[0].ninputs : 0;
}

size_t mlc_output_count(const mlc_model *m)
{
    return m ? m->plans[0].noutputs : 0;
}

static mlc_status info(const mlc_model *m, int kind, size_t i, mlc_tensor_info *out)
{
    if (!m || !out || i >= (kind ? m->plans[0].noutputs : m->plans[0].ninputs))
        return MLC_ERR_USAGE;
    const mlc_iorow *io = kind ? &m->plans[0].outputs[i] : &m->plans[0].inputs[i];
    memset(out, 0, sizeof *out);
    out->name = io->name;
    out->dtype = io->dtype;
    out->ndim = io->ndim;
    for (int d = 0; d < io->ndim; d++) {
        out->dims[d] = io->shape[d];
        out->max_dims[d] = io->has_max ? io->max_shape[d] : -1;
        if (io->rec && io->rec->v.items[d].type != MP_INT)
            out->dim_names[d] = io->dim_text[d];
    }
    if (io->batched) {
        out->dims[0] = -1;
        out->dim_names[0] = "N";
    }
    return MLC_OK;
}

mlc_status mlc_input_info(const mlc_model *m, size_t i, mlc_tensor_info *out)
{
    return info(m, 0, i, out);
}

mlc_status mlc_output_info(const mlc_model *m, size_t i, mlc_tensor_info *out)
{
    return info(m, 1, i, out);
}

mlc_status mlc_model_facts_get(const mlc_model *m, mlc_model_facts *f)
{
    if (!m || !f)
        return MLC_ERR_USAGE;
    memset(f, 0, sizeof *f);
    const mlc_plan *last = &m->plans[m->nplans - 1];
    f->format_major = m->fmt_major;
    f->format_minor = m->fmt_minor;
    f->level = last->code[last->chosen].level;
    f->arch = last->code[last->chosen].arch;
    f->variants = last->ncode;
    f->plans = m->nplans;
    for (size_t p = 0; p < m->nplans && p < 64; p++)
        f->batch_sizes[p] = m->plans[p].batch;
    f->arena_bytes = (size_t)m->arena_bytes;
    for (size_t p = 0; p < m->nplans; p++)
        f->code_bytes += m->plans[p].image.code_size;
    f->instructions = last->nprogram;
    f->threads = m->threads;
    f->signed_bundle = m->signed_bundle;
    for (size_t i = 0; i < last->ninputs; i++)
        f->inputs_in_place += last->inputs[i].bindable;
    for (size_t i = 0; i < last->noutputs; i++)
        f->outputs_in_place += last->outputs[i].bindable;
    if (last->sym) {
        f->symbolic = 1;
        f->arena_bytes = last->sym->bounded ? (size_t)last->sym->bound_arena
                                            : last->sym->arena_size;
        f->plans = 1 + m->nspecialized;
        for (size_t p = 0; p < m->nspecialized && p + 1 < 64; p++)
            f->batch_sizes[p + 1] = m->specialized[p].batch;
    }
    return MLC_OK;
}

