/* ONNX Runtime through its C API, timed as mlcrun bench times libmlcrt, for bench/c_runtime.py:
 * one float32 input and one output, both caller-owned tensors made once, OrtApi::Run on each,
 * clock_gettime around each Run; p50 and min of the timed runs, then the output's first 16
 * values (input i is ((i * 7919) % 1000) / 1000).
 *
 *   cc -O2 bench/ort_c_run.c -ldl -o ort_c_run
 *   ./ort_c_run LIBONNXRUNTIME.so MODEL.onnx INPUT OUTPUT "1,784" "1,10" RUNS THREADS
 *
 * No ONNX Runtime header is needed: the library is opened with dlopen and the few OrtApi
 * members used are called by their index in the OrtApi table, which ONNX Runtime only ever
 * appends to (the indices are those of onnxruntime_c_api.h; the thread-count call is checked at
 * run time by counting this process's threads after the session is made). */
#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void *(*api_fn)();              /* every member used returns a status pointer (or a
                                           message), takes pointers and ints */
typedef struct {
    const void *(*get_api)(uint32_t version);
    const char *(*version)(void);
} api_base;

enum {                                  /* OrtApi member indices */
    GET_ERROR_MESSAGE = 2,
    CREATE_ENV = 3,
    CREATE_SESSION = 7,
    RUN = 9,
    CREATE_SESSION_OPTIONS = 10,
    SET_INTRA_OP_THREADS = 24,
    SET_INTER_OP_THREADS = 25,
    CREATE_TENSOR_WITH_DATA = 49,
    CREATE_CPU_MEMORY_INFO = 69,
};
#define ORT_API_VERSION_USED 16u         /* the members above all exist since version 1 */
#define ORT_FLOAT 1                     /* ONNXTensorElementDataType FLOAT */

static api_fn const *api;

static void check(void *status, const char *what)
{
    if (status) {
        const char *(*message)(void *) = (const char *(*)(void *))api[GET_ERROR_MESSAGE];
        fprintf(stderr, "error: %s: %s\n", what, message(status));
        exit(1);
    }
}

static size_t parse_dims(const char *text, int64_t *dims, size_t *count)
{
    size_t n = 0, elems = 1;
    char *end;
    while (*text && n < 8) {
        dims[n] = strtoll(text, &end, 10);
        elems *= (size_t)dims[n++];
        text = *end == ',' ? end + 1 : end;
        if (end == text && *end)
            break;
    }
    *count = n;
    return elems;
}

static int threads_now(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

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

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: %s LIB.so MODEL.onnx INPUT OUTPUT IN_DIMS OUT_DIMS RUNS "
                "THREADS\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "error: %s\n", dlerror());
        return 1;
    }
    const api_base *(*get_base)(void) = (const api_base *(*)(void))dlsym(lib, "OrtGetApiBase");
    if (!get_base) {
        fprintf(stderr, "error: %s has no OrtGetApiBase\n", argv[1]);
        return 1;
    }
    api = get_base()->get_api(ORT_API_VERSION_USED);
    if (!api) {
        fprintf(stderr, "error: %s does not offer OrtApi version %u\n", argv[1],
                ORT_API_VERSION_USED);
        return 1;
    }
    int runs = atoi(argv[7]), threads = atoi(argv[8]);
    if (runs < 10 || threads < 1) {
        fprintf(stderr, "error: RUNS >= 10 and THREADS >= 1\n");
        return 2;
    }
    void *env, *opts, *session, *info, *in_value, *out_value;
    check(api[CREATE_ENV](3 /* ERROR */, "bench", &env), "CreateEnv");
    int before = threads_now();
    check(api[CREATE_SESSION_OPTIONS](&opts), "CreateSessionOptions");
    check(api[SET_INTRA_OP_THREADS](opts, threads), "SetIntraOpNumThreads");
    check(api[SET_INTER_OP_THREADS](opts, 1), "SetInterOpNumThreads");
    check(api[CREATE_SESSION](env, argv[2], opts, &session), "CreateSession");
    int added = threads_now() - before;
    if (added != threads - 1) {   /* the intra-op pool has threads - 1 workers */
        fprintf(stderr, "error: the session started %d threads, expected %d: the OrtApi "
                "indices do not match this library\n", added, threads - 1);
        return 1;
    }
    int64_t in_dims[8], out_dims[8];
    size_t in_rank, out_rank;
    size_t in_n = parse_dims(argv[5], in_dims, &in_rank);
    size_t out_n = parse_dims(argv[6], out_dims, &out_rank);
    float *x = aligned_alloc(64, (in_n * 4 + 63) / 64 * 64);
    float *y = aligned_alloc(64, (out_n * 4 + 63) / 64 * 64);
    for (size_t i = 0; i < in_n; i++)   /* the deterministic input mlcrun bench uses */
        x[i] = (float)((i * 7919u) % 1000u) / 1000.0f;
    check(api[CREATE_CPU_MEMORY_INFO](1 /* arena */, 0 /* default */, &info),
          "CreateCpuMemoryInfo");
    check(api[CREATE_TENSOR_WITH_DATA](info, x, in_n * 4, in_dims, in_rank, ORT_FLOAT,
                                       &in_value), "CreateTensorWithDataAsOrtValue");
    check(api[CREATE_TENSOR_WITH_DATA](info, y, out_n * 4, out_dims, out_rank, ORT_FLOAT,
                                       &out_value), "CreateTensorWithDataAsOrtValue");
    const char *in_names[1] = {argv[3]}, *out_names[1] = {argv[4]};
    const void *inputs[1] = {in_value};
    void *outputs[1] = {out_value};
    double *t = malloc(sizeof *t * (size_t)runs);
    for (int r = 0; r < runs / 10 + 1; r++)
        check(api[RUN](session, NULL, in_names, inputs, (size_t)1, out_names, (size_t)1,
                       outputs), "Run");
    for (int r = 0; r < runs; r++) {
        double t0 = now_ns();
        void *status = api[RUN](session, NULL, in_names, inputs, (size_t)1, out_names,
                                (size_t)1, outputs);
        t[r] = now_ns() - t0;
        check(status, "Run");
    }
    if (outputs[0] != out_value) {
        fprintf(stderr, "error: Run did not write the caller's output tensor\n");
        return 1;
    }
    qsort(t, (size_t)runs, sizeof *t, by_value);
    printf("onnxruntime %s C API: p50 %.2f us, min %.2f us (%d runs, %d thread%s)\n",
           get_base()->version(), t[runs / 2] / 1e3, t[0] / 1e3, runs, threads,
           threads > 1 ? "s" : "");
    printf("output:");   /* its first values, for a check against the Python API */
    for (size_t i = 0; i < out_n && i < 16; i++)
        printf(" %.9g", y[i]);
    printf("\n");
    return 0;
}
