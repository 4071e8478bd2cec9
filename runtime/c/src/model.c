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
    return "0.1 (format 1.4, abi 1)";
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
    /* count, then fill */
    for (int pass = 0; pass < 2; pass++) {
        size_t pc = 0, k = 0;
        while (pc < nw) {
            int32_t op = w[pc];
            const char *why = NULL;
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
        if (!pass) {
            p->nprogram = k;
            p->program = mlc_zalloc(&m->alloc, (k + 1) * sizeof(mlc_instr));
            if (!p->program)
                return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        }
    }
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
    return MLC_OK;
}

/* ---- zero-copy inputs and outputs (runtime/model.py Model._bindings, _output_bindings) ---- */

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
static void plan_bindings(mlc_model *m, mlc_plan *p)
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
                 && m->constants[t->ref].size == t->nbytes
                 && mlc_storage(m->constant_dtypes[t->ref]) == mlc_storage(t->dtype))
            p->addr[i] = (uint8_t *)m->data + m->data_start + m->constants[t->ref].off;
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
        } else if (!p->sym) {
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
        plan_bindings(m, p);
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
    size_t k = 0;
    for (size_t i = 0; i < p->nprogram; i++) {
        mlc_instr *in = &p->program[i];
        if (in->op == OP_KERNEL) {
            p->table[3 * k] = p->kernel_addr[in->target];
            p->table[3 * k + 1] = (uint64_t)(uintptr_t)in->args;
            p->table[3 * k + 2] = p->kernels[in->target].parallel && p->threads
                                  ? (uint64_t)m->threads : 0;
            if (p->nsegments && p->segments[p->nsegments - 1].start >= 0
                && p->segments[p->nsegments - 1].end == (int64_t)k)
                p->segments[p->nsegments - 1].end = (int64_t)k + 1;
            else
                p->segments[p->nsegments++] = (mlc_segment){(int64_t)k, (int64_t)k + 1};
            k++;
        } else {
            p->segments[p->nsegments++] = (mlc_segment){-1 - (int64_t)i, 0};
        }
    }
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
    mlc_status s = open_common(m, o, err);
    if (s) {
        mlc_close(m);
        return s;
    }
    *out = m;
    return MLC_OK;
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
    mlc_status s = open_common(m, o, err);
    if (s) {
        mlc_close(m);
        return s;
    }
    *out = m;
    return MLC_OK;
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

/* ---- running ---- */

static mlc_status execute(mlc_model *m, mlc_plan *p, mlc_error *err)
{
    if (p->segments) {
        for (size_t s = 0; s < p->nsegments; s++) {
            const mlc_segment *seg = &p->segments[s];
            if (seg->start >= 0) {
                mlc_threads_steps(p->threads, &p->pool, p->table, seg->start, seg->end);
                continue;
            }
            const mlc_instr *in = &p->program[-1 - seg->start];
            if (in->op == OP_COPY) {
                memcpy(p->addr[in->operands[0]], p->addr[in->target],
                       (size_t)p->tensors[in->target].nbytes);
            } else {
                const mlc_site *site = &p->sites[in->target];
                if (site->fn(site->user, in->tensors, (int)in->n - 1, &in->tensors[in->n - 1],
                             &site->attrs))
                    return mlc_fail(err, MLC_ERR_INTERNAL, "%s: library function %s failed",
                                    m->name, site->func);
            }
        }
        return MLC_OK;
    }
    for (size_t i = 0; i < p->nprogram; i++) {
        const mlc_instr *in = &p->program[i];
        if (in->op == OP_KERNEL) {
            mlc_kernel_fn fn = (mlc_kernel_fn)p->kernel_addr[in->target];
            if (p->threads && p->kernels[in->target].parallel)
                mlc_threads_run(p->threads, fn, in->args, m->threads);
            else
                fn(in->args, 0, 1);
        } else if (in->op == OP_COPY) {
            memcpy(p->addr[in->operands[0]], p->addr[in->target],
                   (size_t)p->tensors[in->target].nbytes);
        } else {
            const mlc_site *site = &p->sites[in->target];
            if (site->fn(site->user, in->tensors, (int)in->n - 1, &in->tensors[in->n - 1],
                         &site->attrs))
                return mlc_fail(err, MLC_ERR_INTERNAL, "%s: library function %s failed",
                                m->name, site->func);
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
    shape_text(t->dims, t->ndim, got, sizeof got, 0);
    shape_text(spec->shape, spec->ndim, want, sizeof want, spec->batched);
    int same = t->ndim == spec->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        if (t->dims[d] != spec->shape[d] && !(spec->batched && d == 0))
            same = 0;
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
    if (spec->batched && t->dims[0] < 1)
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
    for (size_t v = 0; v < nvars; v++)
        if (env[v] < 1)
            return mlc_fail(err, MLC_ERR_INPUT, "the inputs bind no valid size %s",
                            p->sym->vars[v]);
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
    for (size_t i = 0; !s && i < p->noutputs; i++) {
        uint32_t t = p->outputs[i].tensor;
        memcpy(outputs[i].data, p->addr[t], (size_t)sym->tbytes[t]);
        outputs[i].dtype = p->tensors[t].dtype;
        outputs[i].ndim = p->tensors[t].ndim;
        memcpy(outputs[i].dims, sym->tdims + (size_t)t * MLC_MAX_DIMS, sizeof outputs[i].dims);
    }
    return s;
}

mlc_status mlc_run(mlc_model *m, const mlc_tensor *inputs, size_t ninputs, mlc_tensor *outputs,
                   size_t noutputs, mlc_error *err)
{
    if (!m)
        return mlc_fail(err, MLC_ERR_USAGE, "mlc_run: model is NULL");
    mlc_plan *last = &m->plans[m->nplans - 1];
    if (last->sym) {
        if (ninputs != last->ninputs || (ninputs && !inputs))
            return mlc_fail(err, MLC_ERR_INPUT, "%s takes %zu input(s), got %zu", m->name,
                            last->ninputs, ninputs);
        if (noutputs != last->noutputs || (noutputs && !outputs))
            return mlc_fail(err, MLC_ERR_USAGE, "%s has %zu output(s); mlc_run was given %zu",
                            m->name, last->noutputs, noutputs);
        pthread_mutex_lock(&m->lock);
        mlc_status s = run_symbolic(m, inputs, outputs, err);
        pthread_mutex_unlock(&m->lock);
        return s;
    }
    if (ninputs != last->ninputs || (ninputs && !inputs))
        return mlc_fail(err, MLC_ERR_INPUT, "%s takes %zu input(s), got %zu", m->name,
                        last->ninputs, ninputs);
    if (noutputs != last->noutputs || (noutputs && !outputs))
        return mlc_fail(err, MLC_ERR_USAGE, "%s has %zu output(s); mlc_run was given %zu",
                        m->name, last->noutputs, noutputs);
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
