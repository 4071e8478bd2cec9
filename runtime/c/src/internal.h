/* Internal declarations of libmlcrt (not installed). */
#ifndef MLCRT_INTERNAL_H
#define MLCRT_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>

#include "mlcrt.h"

#if defined(__GNUC__)
#define MLC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MLC_PRINTF(a, b)
#endif

mlc_status mlc_fail(mlc_error *err, mlc_status status, const char *fmt, ...) MLC_PRINTF(3, 4);

/* ---- load-time allocations: one list, freed at close ---- */
typedef struct mlc_pool_block mlc_pool_block;
typedef struct mlc_alloc {
    mlc_pool_block *head;
} mlc_alloc;
void *mlc_zalloc(mlc_alloc *a, size_t size);   /* zeroed, 16-byte aligned; NULL on overflow */
void mlc_alloc_free(mlc_alloc *a);

/* ---- msgpack (msgpack.c): a strict reader into a tree of nodes ---- */
enum { MP_NIL, MP_BOOL, MP_INT, MP_UINT, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP };
typedef struct mp_node {
    uint8_t type;
    uint32_t len;            /* STR/BIN bytes, ARRAY items, MAP pairs */
    union {
        int64_t i;           /* INT (and UINT values <= INT64_MAX), BOOL */
        uint64_t u;          /* UINT above INT64_MAX */
        double f;
        const uint8_t *p;    /* STR/BIN bytes (in the file) */
        struct mp_node *items;   /* ARRAY: len items; MAP: 2*len, key then value */
    } v;
} mp_node;
#define MP_MAX_DEPTH 64
/* Parse one value from data[0..size); on success *used is its length. */
mlc_status mp_parse(const uint8_t *data, size_t size, mlc_alloc *alloc, mp_node **root,
                    size_t *used, mlc_error *err);
const mp_node *mp_get(const mp_node *map, const char *key);   /* NULL if absent / not a map */
int mp_str_eq(const mp_node *n, const char *s);
int mp_is_int(const mp_node *n);                  /* INT (not bool) */
char *mp_strdup(mlc_alloc *a, const mp_node *n);  /* a STR as a NUL-terminated copy */

/* ---- SHA-256 (sha256.c) ---- */
typedef struct mlc_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t fill;
    int accel;                 /* 1: the SHA extensions */
} mlc_sha256;
int mlc_sha256_accelerated(void);   /* this CPU has the SHA extensions the fast path uses */
void mlc_sha256_init(mlc_sha256 *s);                /* accel as the CPU allows */
void mlc_sha256_start(mlc_sha256 *s, int accel);    /* accel: 0 the portable C code, 1 only
                                                       where mlc_sha256_accelerated() */
void mlc_sha256_update(mlc_sha256 *s, const void *data, size_t n);
void mlc_sha256_final(mlc_sha256 *s, uint8_t out[32]);
void mlc_sha256_once(const void *data, size_t n, uint8_t out[32]);

/* ---- Ed25519 (ed25519.c) ---- */
int mlc_ed25519_verify(const uint8_t sig[64], const uint8_t pub[32], const uint8_t *msg,
                       size_t n);

/* ---- CPU (cpu.c) ---- */
typedef struct mlc_cpu {
    char arch[16];
    char *flags;           /* space-separated, NUL-terminated, each in cpuinfo naming */
} mlc_cpu;
mlc_status mlc_cpu_host(mlc_cpu *cpu, const char *arch_override, const char *features_override,
                        mlc_alloc *a, mlc_error *err);
int mlc_cpu_has(const mlc_cpu *cpu, const char *flag);
const char *mlc_cpu_best_level(const mlc_cpu *cpu);
typedef struct mlc_variant_req {
    const char *arch;
    const char *level;
    const char *const *features;
    size_t nfeatures;
} mlc_variant_req;
/* The index of the variant to run, or -1 with err set (MLC_ERR_CPU). */
long mlc_cpu_pick(const mlc_cpu *cpu, const mlc_variant_req *v, size_t n, const char *name,
                  mlc_error *err);
const char *mlc_real_arch(void);

/* ---- ELF loader (elf.c) ---- */
typedef struct mlc_image {
    void *raw;
    size_t mapped;
    uint8_t *base;
    size_t size;
    size_t code_size;
    size_t nsyms;
    const char **sym_names;
    uintptr_t *sym_addrs;
} mlc_image;
mlc_status mlc_elf_load(const uint8_t *data, size_t size, const char *arch, mlc_alloc *a,
                        mlc_image *img, mlc_error *err);
uintptr_t mlc_image_symbol(const mlc_image *img, const char *name);   /* 0 if absent */
void mlc_elf_unload(mlc_image *img);

/* ---- threads (pool.c) ---- */
typedef void (*mlc_kernel_fn)(void **args, int64_t task, int64_t ntasks);
typedef struct mlc_threads mlc_threads;
typedef struct mlc_pool_code {
    uintptr_t worker, run, join, steps;
    int ranges;   /* mlcpack_pool_ranges: a job may have more tasks than threads */
} mlc_pool_code;
mlc_status mlc_threads_start(int nworkers, const mlc_pool_code *code, mlc_threads **out,
                             mlc_error *err);
void mlc_threads_stop(mlc_threads *t);
/* How many tasks a parallel kernel of `macs` multiply-adds (-1: unknown) is posted as on
 * `threads` threads; runtime/vm.py task_count's rule. */
int64_t mlc_task_count(int threads, int64_t macs, int ranges);
/* Run ntasks tasks of `fn` (task 0 on this thread). */
void mlc_threads_run(mlc_threads *t, mlc_kernel_fn fn, void **args, int64_t ntasks);
/* Run the kernel calls table[start..end) (3 u64 each) with the bundle's step loop. */
void mlc_threads_steps(mlc_threads *t, const mlc_pool_code *code, uint64_t *table, int64_t start,
                       int64_t end);
#define MLC_MAX_THREADS 63

/* ---- library functions (library.c) ---- */
struct mlc_attrs {
    const mp_node *map;   /* may be NULL */
};
mlc_library_fn mlc_builtin_library(const char *name);

#endif
