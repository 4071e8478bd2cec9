/* mlcrt.h: libmlcrt, the C runtime of mlcpack bundles (.mlc).
 *
 * Loads a bundle the Python runtime loads (format 1.x), checks its format version, its SHA-256
 * content digest and the CPU's features before any code is mapped, maps its ELF object code
 * itself (no dlopen, no linker) and runs its VM program over a static memory plan. Outputs are
 * bit-identical to the Python runtime's for the same bundle and thread count.
 *
 * Contract: no global state (every object is reached from a handle the caller holds), nothing
 * printed, no exit(), no allocation during mlc_run (but a format 1.9 row store's, below), every
 * input checked. One model may be run from several threads: calls take turns (a mutex per
 * model). Errors: every function returns an
 * mlc_status whose value is the exit code the mlcpack command line uses for the same case, with a
 * one-line message in the caller's mlc_error.
 */
#ifndef MLCRT_H
#define MLCRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MLC_API __attribute__((visibility("default")))
#else
#define MLC_API
#endif

#define MLC_VERSION_MAJOR 0
#define MLC_VERSION_MINOR 1
#define MLC_ABI_VERSION 1
#define MLC_MAX_DIMS 16

/* Status codes: the mlcpack command line's exit codes for the same cases (README). */
typedef enum mlc_status {
    MLC_OK = 0,
    MLC_ERR_USAGE = 2,        /* a bad argument to an API function */
    MLC_ERR_BUNDLE = 3,       /* missing, truncated, corrupted, not a bundle, malformed header */
    MLC_ERR_FORMAT = 4,       /* a bundle format version this runtime does not read */
    MLC_ERR_CPU = 5,          /* this CPU lacks the bundle's features (or architecture) */
    MLC_ERR_CODE = 6,         /* the object code cannot be mapped */
    MLC_ERR_INPUT = 7,        /* an input has the wrong dtype, shape or size */
    MLC_ERR_LIBRARY = 8,      /* the bundle calls a library function nobody registered */
    MLC_ERR_SIGNATURE = 12,   /* not signed by a trusted key, or the signature does not verify */
    MLC_ERR_MISMATCH = 13,    /* verify: the outputs differ from the golden pair */
    MLC_ERR_NO_GOLDEN = 14,   /* verify: the bundle carries no golden pair */
    MLC_ERR_INTERNAL = 70     /* out of memory, a thread that cannot start, a bug */
} mlc_status;

/* A caller-owned error record: the one-line message of the last failure. */
typedef struct mlc_error {
    mlc_status status;
    char message[512];
} mlc_error;

/* Tensor element types (the bundle's dtype names; narrow types are stored as their bits). */
typedef enum mlc_dtype {
    MLC_FLOAT32 = 0, MLC_FLOAT64, MLC_FLOAT16, MLC_INT8, MLC_INT16, MLC_INT32, MLC_INT64,
    MLC_UINT8, MLC_UINT16, MLC_UINT32, MLC_UINT64, MLC_BOOL, MLC_BFLOAT16, MLC_FLOAT8_E4M3FN,
    MLC_FLOAT8_E4M3FNUZ, MLC_FLOAT8_E5M2, MLC_FLOAT8_E5M2FNUZ, MLC_INT4, MLC_UINT4, MLC_INT2,
    MLC_UINT2, MLC_DTYPE_COUNT
} mlc_dtype;

MLC_API const char *mlc_dtype_name(mlc_dtype dtype);   /* "float32"...; "?" when out of range */
MLC_API size_t mlc_dtype_size(mlc_dtype dtype);        /* bytes per element as stored; 0 if unknown */

/* A tensor in caller-owned memory. For mlc_run's inputs: data, nbytes, dtype, ndim and dims
 * give the array; for its outputs: data and nbytes give the buffer (its capacity), and the run
 * writes dtype, ndim and dims (an output whose size the model counts at run time, format 1.6,
 * needs the capacity mlc_output_nbytes gives, its bound, and dims say how much was written).
 * Arrays are C-contiguous. */
typedef struct mlc_tensor {
    void *data;
    size_t nbytes;
    mlc_dtype dtype;
    int ndim;
    int64_t dims[MLC_MAX_DIMS];
} mlc_tensor;

/* An input or output as the bundle declares it. dims[i] is -1 where the bundle accepts any
 * size there (a dynamic batch, a symbolic dim), with dim_names[i] its name ("N" for a batch). */
typedef struct mlc_tensor_info {
    const char *name;
    mlc_dtype dtype;
    int ndim;
    int64_t dims[MLC_MAX_DIMS];
    const char *dim_names[MLC_MAX_DIMS];   /* NULL where the dim is fixed */
    int64_t max_dims[MLC_MAX_DIMS];        /* the largest size a -1 dim may take; -1: none */
} mlc_tensor_info;

/* Library functions (the bundle's call_library("ns.name", ...)): destination-passing style,
 * reading inputs[0..ninputs-1] and writing *output. Return 0 on success; any other value fails
 * the run with MLC_ERR_INTERNAL. attrs gives the call site's attributes (mlc_attr_*). */
typedef struct mlc_attrs mlc_attrs;
typedef int (*mlc_library_fn)(void *user, const mlc_tensor *inputs, int ninputs,
                              mlc_tensor *output, const mlc_attrs *attrs);
typedef struct mlc_library_entry {
    const char *name;      /* namespaced: "myapp.swish" */
    mlc_library_fn fn;
    void *user;
} mlc_library_entry;

/* An integer / float attribute of a call site; `fallback` when absent or of another type. */
MLC_API int64_t mlc_attr_int(const mlc_attrs *attrs, const char *name, int64_t fallback);
MLC_API double mlc_attr_float(const mlc_attrs *attrs, const char *name, double fallback);

typedef struct mlc_options {
    int threads;                  /* parallel kernels run on this many threads; 0 or 1: one */
    int skip_digest;              /* 1: do not check the SHA-256 content digest (not advised) */
    const char *cpu_features;     /* NULL: detect; else comma/space-separated cpuinfo flags the
                                     runtime assumes (as MLCPACK_CPU_FEATURES in Python) */
    const char *cpu_arch;         /* NULL: this machine; else "x86_64"/"aarch64" (as
                                     MLCPACK_CPU_ARCH: foreign code is refused, never mapped) */
    const mlc_library_entry *library;   /* the application's library functions */
    size_t library_count;
    const uint8_t (*trusted_keys)[32];  /* Ed25519 public keys; with require_signature set,
                                           only bundles signed by one of them load */
    size_t trusted_key_count;
    int require_signature;
} mlc_options;

MLC_API void mlc_options_init(mlc_options *options);   /* all zero/NULL: one thread, detect the CPU */

typedef struct mlc_model mlc_model;

/* Open a bundle. From a path: the file is mapped read-only; from memory: `data` must stay
 * valid and unchanged until mlc_close (it is read in place, never copied). `options` may be
 * NULL. On failure *model is NULL and err says why. */
MLC_API mlc_status mlc_open_file(const char *path, const mlc_options *options, mlc_model **model,
                         mlc_error *err);
MLC_API mlc_status mlc_open_memory(const void *data, size_t size, const mlc_options *options,
                           mlc_model **model, mlc_error *err);
MLC_API void mlc_close(mlc_model *model);   /* NULL is fine */

MLC_API size_t mlc_input_count(const mlc_model *model);
MLC_API size_t mlc_output_count(const mlc_model *model);
/* The i-th input/output spec (in the bundle's order); the pointers live until mlc_close. */
MLC_API mlc_status mlc_input_info(const mlc_model *model, size_t i, mlc_tensor_info *info);
MLC_API mlc_status mlc_output_info(const mlc_model *model, size_t i, mlc_tensor_info *info);

/* Run once: inputs[i] is the i-th input; outputs[i] receives the i-th output (its buffer
 * must hold it: nbytes >= the output's size). Allocates nothing, except for a Loop's scan output
 * with no bound at export (format 1.9, a row store): its rows grow by doubling (realloc) during
 * the run, kept for the next run, freed at mlc_close; they are copied into outputs[i] after the
 * run, and a buffer smaller than this run's rows fails with MLC_ERR_USAGE naming the bytes
 * needed (mlc_output_nbytes gives its cap's bytes). */
MLC_API mlc_status mlc_run(mlc_model *model, const mlc_tensor *inputs, size_t ninputs,
                   mlc_tensor *outputs, size_t noutputs, mlc_error *err);
/* The bytes output `i` takes for the given inputs' shapes (for a fixed-shape bundle, NULL
 * inputs are fine). */
MLC_API mlc_status mlc_output_nbytes(const mlc_model *model, size_t i, const mlc_tensor *inputs,
                             size_t ninputs, size_t *nbytes, mlc_error *err);

/* Run the embedded golden pair and compare (the Python runtime's rule): MLC_OK on pass,
 * MLC_ERR_MISMATCH or MLC_ERR_NO_GOLDEN otherwise; `summary` (may be NULL) gets one line. */
MLC_API mlc_status mlc_verify(mlc_model *model, char *summary, size_t summary_size, mlc_error *err);

/* Facts about an open model. */
typedef struct mlc_model_facts {
    int format_major, format_minor;
    const char *level;          /* the chosen code variant's level ("x86-64-v3") */
    const char *arch;
    size_t variants;            /* code variants in the bundle (per plan) */
    size_t plans;               /* batch plans (1 unless a dynamic-batch bundle) */
    int64_t batch_sizes[64];
    size_t arena_bytes;         /* the working memory it holds */
    size_t code_bytes;          /* mapped object code */
    size_t instructions;        /* VM instructions of the largest plan */
    int threads;
    int symbolic;
    int signed_bundle;
    size_t inputs_in_place;     /* inputs kernels read where the caller holds them */
    size_t outputs_in_place;    /* outputs kernels write into the caller's (64-byte aligned) buffer */
} mlc_model_facts;
MLC_API mlc_status mlc_model_facts_get(const mlc_model *model, mlc_model_facts *facts);

/* The runtime's version: "0.1 (format 1.4, abi 1)". */
MLC_API const char *mlc_version(void);

#ifdef __cplusplus
}
#endif
#endif
