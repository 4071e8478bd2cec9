/* The open model's internal structure (model.c, verify.c). */
#ifndef MLCRT_MODEL_H
#define MLCRT_MODEL_H

#include "internal.h"

typedef struct { uint64_t off, size; } mlc_ref;

/* format 1.9: T_STORE, a loop's rows with no bound at export, appended by APPEND (run.c) */
enum { T_ARENA = 0, T_CONST = 1, T_SIZES = 2, T_STORE = 3 };
typedef struct {
    int kind;                  /* T_ARENA, T_CONST, T_SIZES (symbolic plans) */
    const mp_node *rec;        /* symbolic plans: the shape's dim records */
    uint64_t ref;
    int ndim;
    int64_t shape[MLC_MAX_DIMS];
    mlc_dtype dtype;
    uint64_t nbytes;
} mlc_trow;

typedef struct {
    char *name;
    int ndim;
    int64_t shape[MLC_MAX_DIMS];
    int64_t max_shape[MLC_MAX_DIMS];
    int has_max;
    mlc_dtype dtype;
    uint32_t tensor;
    uint64_t nbytes;
    int batched;
    const mp_node *rec;        /* symbolic plans: the shape's dim records */
    const char *dim_text[MLC_MAX_DIMS];
    const mp_node *views;      /* the tensor rows over its bytes (its reshapes), or NULL */
    void ***slots;             /* zero-copy: the kernel argument slots that hold its address */
    size_t nslots;
    int bindable;              /* 1: kernels only read it (input) / only kernels use it (output) */
} mlc_iorow;

typedef struct {
    char *name, *symbol;
    uint32_t nin, nout;
    uint64_t workspace;
    const mp_node *workspace_rec;
    int parallel;
    int symbolic;
    int64_t macs;              /* the header's multiply-adds, -1 where it has none */
} mlc_krow;

typedef struct {
    char *arch, *level;
    const char **features;
    size_t nfeatures;
    mlc_ref object;
} mlc_variant;

typedef struct {
    char *func;
    mlc_attrs attrs;
    mlc_library_fn fn;
    void *user;
} mlc_site;

/* format 1.7: JUMP_UNLESS, JUMP and TRAP (an If that runs only its taken branch); a decoded
 * jump's target is the index of the instruction it continues at (nprogram: the end), always
 * after the jump itself, so every run ends */
enum { OP_KERNEL = 1, OP_LIB = 2, OP_COPY = 3, OP_BIND = 4, OP_JUMP_UNLESS = 5, OP_JUMP = 6,
       OP_TRAP = 7, OP_LOOP = 8, OP_NEXT = 9, OP_APPEND = 10 };
/* format 1.8: LOOP (operands m, c, i; target: the instruction after its NEXT) and NEXT (operand
 * c; target: its LOOP), verified at load (model.c: link_loops): each names the other, loops nest,
 * no jump enters or leaves a loop's body; a loop's count lives in the plan (loop_iter,
 * loop_limit), never in a tensor, so a run ends after at most the counts read at the LOOPs */
typedef struct {
    int op;
    uint32_t target;
    uint32_t n;
    const int32_t *operands;   /* into a decoded copy of the bytecode */
    void **args;               /* OP_KERNEL: its void*[] */
    mlc_tensor *tensors;       /* OP_LIB: operands as tensors (inputs, then the output) */
} mlc_instr;

/* format 1.9: the rows APPEND adds to one STORE row during a run: malloc'd, grown by doubling,
 * kept across runs (emptied at each run's start), freed at close; at most the bound of size
 * variable var rows and MLC_STORE_MAX_BYTES */
#define MLC_STORE_MAX_BYTES ((uint64_t)1 << 32)
typedef struct {
    uint32_t tensor;           /* its STORE row */
    int var;                   /* the size variable that counts its rows (its first dim) */
    uint8_t *data;
    uint64_t capacity, row_bytes;
    int64_t count;
    int lead;                  /* format 1.10: the count's axis (1s before it) */
    int grown;                 /* format 1.10: a Loop's carried value that grows ("grows") */
} mlc_store;

typedef struct {
    int64_t start, end;        /* start >= 0: kernel calls [start, end) of the table;
                                  start < 0: instruction -1 - start */
} mlc_segment;

/* A symbolic plan's size variables, buffers, relations and bound (runtime/symbolic.py). */
typedef struct {
    size_t nvars;
    char **vars;
    size_t nbuffers;
    const mp_node **buf_rec;
    int64_t *buf_start, *buf_end;
    size_t nchecks;
    const mp_node **checks;     /* [op, a, b, text] rows */
    size_t ndynamic;            /* format 1.6: sizes a kernel counts (BIND_SIZE) */
    int *dyn_var;               /* each one's index in vars */
    const mp_node **dyn_rec;    /* its upper bound, a dim record over the input sizes */
    size_t nvalues;
    const mp_node **values;     /* format 1.6: [input, rule, [var...], *args] rows */
    int bounded;
    int64_t *bound_vals, *bound_offsets, *bound_sizes;
    uint64_t bound_arena;
    /* per run, allocated at load */
    int64_t *env, *last_env;
    int have_last;
    int64_t *sizes;             /* the SIZES row the kernels read */
    int64_t *limits;            /* each variable's largest value for this shape (BIND_SIZE) */
    uint64_t *buf_bytes, *offsets;
    size_t *order;
    uint64_t *tbytes;           /* each tensor's bytes at the current shape */
    int64_t *tdims;             /* each tensor's dims at the current shape, MLC_MAX_DIMS each */
    uint8_t *arena;
    size_t arena_size;
} mlc_symbolic;

typedef struct mlc_plan {
    int64_t batch;
    mlc_symbolic *sym;          /* NULL: a static plan */
    mlc_iorow *inputs, *outputs;
    size_t ninputs, noutputs;
    mlc_krow *kernels;
    size_t nkernels;
    mlc_variant *code;
    size_t ncode;
    mlc_trow *tensors;
    size_t ntensors;
    mlc_site *sites;
    size_t nsites;
    mlc_ref bytecode;
    uint64_t arena_bytes;
    /* prepared at load */
    long chosen;
    mlc_image image;
    uintptr_t *kernel_addr;
    mlc_instr *program;
    size_t nprogram;
    uint8_t **addr;            /* per tensor */
    uint64_t *table;           /* the step loop's table: 3 u64 per kernel call */
    size_t ncalls;
    mlc_segment *segments;
    size_t nsegments;
    size_t *segment_at;        /* with jumps: the segment a jump target (or the end) starts */
    int jumps;                 /* the program has jumps (format 1.7) or loops (1.8) */
    int loops;                 /* the program has loops (format 1.8) */
    int64_t *loop_iter, *loop_limit;   /* per instruction: a LOOP's iteration and count */
    int has_stores;            /* the vm record says "stores" (format 1.9) */
    int64_t nstores_declared;  /* its count */
    mlc_store *stores;         /* format 1.9: one per STORE row */
    size_t nstores;
    int32_t *store_of;         /* per tensor: its index in stores, or -1 */
    const mp_node *grows;      /* format 1.10: the vm record's "grows" (STORE rows), or NULL */
    mlc_pool_code pool;
    int has_pool;
    mlc_threads *threads;
} mlc_plan;

typedef struct {
    char *name;
    int ndim;
    int64_t shape[MLC_MAX_DIMS];
    mlc_dtype dtype;
    mlc_ref data;
    double magnitude, quant_step;   /* < 0: absent */
} mlc_golden_row;

struct mlc_model {
    mlc_alloc alloc;
    char name[256];
    const uint8_t *data;
    size_t size;
    void *mapping;
    size_t mapping_size;
    size_t header_end, data_start, data_size;
    mp_node *header;
    int fmt_major, fmt_minor;
    mlc_ref *constants;
    mlc_dtype *constant_dtypes;
    size_t nconstants;
    const uint8_t **constant_addr;  /* where a kernel reads each constant: its payload, or the
                                       float32 values a stored one expands to at load */
    uint64_t *constant_bytes;       /* their size in memory */
    mlc_ref *stored_params;         /* a stored constant's scale and zero point (2 per constant;
                                       size 0 when none) */
    mlc_plan *plans;
    size_t nplans;
    mlc_plan *specialized;      /* a symbolic bundle's static plans (--batch-sizes) */
    size_t nspecialized;
    int batched;                /* a dynamic-batch bundle */
    mlc_golden_row *golden_in, *golden_out;
    size_t ngolden_in, ngolden_out;
    double rtol, atol;
    int has_golden;
    int signed_bundle;
    int threads;
    mlc_cpu cpu;
    uint8_t *arena_raw;
    size_t arena_size;
    uint8_t *arena;
    uint64_t arena_bytes;
    pthread_mutex_t lock;
    int lock_ready;
};

mlc_status mlc_nbytes(const int64_t *shape, int ndim, mlc_dtype dtype, uint64_t *out);
mlc_dtype mlc_storage(mlc_dtype d);
mlc_status mlc_read_file_layout(mlc_model *m, int verify, mlc_error *err);
mlc_status mlc_check_signature(mlc_model *m, const mlc_options *o, mlc_error *err);
mlc_status mlc_parse_header(mlc_model *m, mlc_error *err);
mlc_status mlc_sym_parse(mlc_model *m, const mp_node *rec, mlc_plan *p, mlc_error *err);
mlc_status mlc_sym_dim(const mlc_plan *p, const mp_node *rec, const char *what, mlc_error *err);
mlc_status mlc_sym_eval(const mlc_plan *p, const mp_node *rec, const int64_t *env, int64_t *out);
mlc_status mlc_sym_alloc(mlc_model *m, mlc_plan *p, mlc_error *err);
mlc_status mlc_sym_bind(mlc_model *m, mlc_plan *p, const mlc_tensor *inputs, mlc_error *err);
int mlc_sym_counted(const mlc_symbolic *s, size_t v);
mlc_status mlc_sym_counted_env(const mlc_plan *p, int64_t *env);
/* Format 1.6: bind into env the size variables the inputs' values set (the symbolic record's
 * values rows); bound_by (may be NULL) gets each one's input index. */
int mlc_sym_var(const mlc_plan *p, const mp_node *name);   /* index in vars, or -1 */
mlc_status mlc_sym_values(const mlc_model *m, const mlc_plan *p, const mlc_tensor *inputs,
                          int64_t *env, int *bound_by, mlc_error *err);
mlc_status mlc_sym_plan(mlc_model *m, mlc_plan *p, mlc_error *err);
void mlc_sym_free(mlc_plan *p);
char *mlc_sym_text(mlc_alloc *a, const mp_node *rec);
void mlc_plan_bindings(mlc_model *m, mlc_plan *p);
void mlc_content_digest(const mlc_model *m, const uint8_t *head, uint64_t chunk, uint8_t out[32]);

/* loops.c: format 1.8 */
int mlc_one_element(const mlc_plan *p, int32_t t, mlc_dtype d);
mlc_status mlc_link_loops(mlc_model *m, mlc_plan *p, const int32_t *w, size_t nw,
                          const int64_t *start_of, mlc_error *err);
/* format 1.9: whether APPEND s, r appends arena row r to STORE row s (same dtype, row shape);
 * mlc_link_stores: every STORE row's store (its first dim a counted size variable), none named
 * by another instruction, as many as the vm record says; mlc_store_append: APPEND at run time */
int mlc_store_lead(const mlc_trow *row);
int mlc_append_ok(const mlc_plan *p, int32_t s, int32_t r);
mlc_status mlc_link_stores(mlc_model *m, mlc_plan *p, mlc_error *err);
mlc_status mlc_store_append(const mlc_model *m, mlc_plan *p, const mlc_instr *in,
                            mlc_error *err);
void mlc_stores_free(mlc_plan *p);

#endif
