/* Where a C runtime run's time goes, for bench/c_runtime.py: each kernel of a bundle's static
 * plan called alone (its min and p50 over single calls timed with clock_gettime), and the
 * floor any kernel reading a constant has on this core: a plain AVX2 read of each large
 * constant's bytes where the bundle maps them (the same pages, the same cache state between
 * calls), timed the same way. Built by bench/c_runtime.py against libmlcrt's internal headers:
 *
 *   cc -O3 -mavx2 -Iruntime/c/include -Iruntime/c/src bench/c_kernel_floor.c \
 *      runtime/c/build/libmlcrt.a -lpthread -lm -o floor
 *   ./floor MODEL.mlc [CALLS]
 *
 * Prints one line per kernel ("kernel NAME min US p50 US"), one per parallel kernel split over
 * the runtime's 2 threads as mlc_run posts it ("split NAME min US p50 US": task 0 here, task 1
 * on the worker; its calls alternate with the single-thread ones in blocks) and per constant of
 * at least 64 KiB ("read CONSTANT BYTES min US p50 US GB/s"); x86-64 with AVX2 only. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"
#include "model.h"

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sum every float of [p, p + n): its two halves side by side (two streams measured a little
 * faster than one here), 8 independent accumulators, 32-byte loads. */
__attribute__((noinline)) static float read_all(const float *p, size_t n)
{
    __m256 a[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm256_setzero_ps();
    size_t half = n / 64 * 32;
    const float *q = p + half;
    for (size_t i = 0; i < half; i += 32)
        for (int v = 0; v < 4; v++) {
            a[v] = _mm256_add_ps(a[v], _mm256_loadu_ps(p + i + 8 * v));
            a[v + 4] = _mm256_add_ps(a[v + 4], _mm256_loadu_ps(q + i + 8 * v));
        }
    for (int v = 1; v < 8; v++)
        a[0] = _mm256_add_ps(a[0], a[v]);
    float out[8];
    _mm256_storeu_ps(out, a[0]);
    for (size_t i = 2 * half; i < n; i++)
        out[0] += p[i];
    return out[0] + out[7];
}

static void report(const char *what, const char *name, double *t, int calls, double bytes)
{
    qsort(t, (size_t)calls, sizeof *t, by_value);
    printf("%s %s min %.3f p50 %.3f", what, name, t[0] / 1e3, t[calls / 2] / 1e3);
    if (bytes > 0)
        printf(" bytes %.0f GB/s %.1f", bytes, bytes / t[0]);
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.mlc [CALLS]\n", argv[0]);
        return 2;
    }
    int calls = argc > 2 ? atoi(argv[2]) : 20000;
    if (calls < 10)
        calls = 10;
    mlc_options opt;
    mlc_options_init(&opt);
    opt.threads = 2;   /* the worker a parallel kernel's split timing posts to */
    mlc_model *m;
    mlc_error err;
    if (mlc_open_file(argv[1], &opt, &m, &err) != MLC_OK) {
        fprintf(stderr, "error: %s\n", err.message);
        return err.status;
    }
    mlc_plan *p = &m->plans[0];
    if (p->sym) {
        fprintf(stderr, "error: %s: a symbolic plan (static plans only)\n", argv[1]);
        return 2;
    }
    double *t = malloc(sizeof *t * (size_t)calls);
    double *split = malloc(sizeof *split * (size_t)calls);
    volatile float sink = 0;
    for (size_t i = 0; i < p->nprogram; i++) {
        const mlc_instr *in = &p->program[i];
        if (in->op != OP_KERNEL)
            continue;
        mlc_kernel_fn fn = (mlc_kernel_fn)p->kernel_addr[in->target];
        int parallel = p->threads && p->kernels[in->target].parallel;
        for (int c = 0; c < calls / 10; c++)
            fn(in->args, 0, 1);
        /* blocks of 1000 calls, alternating: one thread, then split over two (after 100
         * untimed split calls: the worker, parked during the one-thread block, wakes up) */
        for (int c0 = 0; c0 < calls; c0 += 1000) {
            int c1 = c0 + 1000 < calls ? c0 + 1000 : calls;
            for (int c = c0; c < c1; c++) {
                double t0 = now_ns();
                fn(in->args, 0, 1);
                t[c] = now_ns() - t0;
            }
            for (int c = 0; c < 100 && parallel; c++)
                mlc_threads_run(p->threads, fn, in->args, 2);
            for (int c = c0; c < c1 && parallel; c++) {
                double t0 = now_ns();
                mlc_threads_run(p->threads, fn, in->args, 2);
                split[c] = now_ns() - t0;
            }
        }
        report("kernel", p->kernels[in->target].name, t, calls, 0);
        if (parallel)
            report("split", p->kernels[in->target].name, split, calls, 0);
    }
    for (size_t k = 0; k < m->nconstants; k++) {
        if (m->constant_bytes[k] < 65536)
            continue;
        const float *data = (const float *)m->constant_addr[k];
        size_t n = (size_t)m->constant_bytes[k] / 4;
        for (int c = 0; c < calls / 10; c++)
            sink += read_all(data, n);
        for (int c = 0; c < calls; c++) {
            double t0 = now_ns();
            sink += read_all(data, n);
            t[c] = now_ns() - t0;
        }
        char name[32];
        snprintf(name, sizeof name, "constant%zu", k);
        report("read", name, t, calls, (double)m->constant_bytes[k]);
    }
    free(t);
    free(split);
    mlc_close(m);
    return 0;
}
