/* mlcrun: run, verify, time and describe mlcpack bundles with libmlcrt alone.
 *
 *   mlcrun run MODEL.mlc IN0.npy [IN1.npy ...] -o OUTDIR [--threads N]
 *   mlcrun verify MODEL.mlc [--threads N]
 *   mlcrun bench MODEL.mlc [--threads N] [--runs N]
 *   mlcrun inspect MODEL.mlc
 *
 * Errors are one line on stderr, "error: ...", with the exit codes of mlcpack's README table
 * (libmlcrt's status values are those codes). MLCPACK_CPU_FEATURES, MLCPACK_CPU_ARCH and
 * MLCPACK_NUM_THREADS are read here, once, as the Python runtime reads them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "mlcrt.h"
#include "npy.h"

static int fail(int code, const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return code;
}

static int usage(const char *why)
{
    fprintf(stderr, "error: %s (see mlcrun -h)\n", why);
    return 2;
}

static const char USAGE[] =
    "usage: mlcrun COMMAND MODEL.mlc [...]\n"
    "  run MODEL.mlc IN0.npy [IN1.npy ...] -o OUTDIR [--threads N] [--trusted-key KEY.pub]\n"
    "  verify MODEL.mlc [--threads N] [--trusted-key KEY.pub]\n"
    "  bench MODEL.mlc [--threads N] [--runs N]\n"
    "  inspect MODEL.mlc\n";

static int parse_positive(const char *text, const char *flag, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < 1 || v > 1000000000) {
        fprintf(stderr, "error: %s must be at least 1, got %s (see mlcrun -h)\n", flag, text);
        return 2;
    }
    *out = (int)v;
    return 0;
}

/* --trusted-key files: PEM SubjectPublicKeyInfo of an Ed25519 key, or its raw 32 bytes. */
typedef struct {
    uint8_t keys[16][32];
    size_t count;
} trusted;

static int b64(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int read_key(const char *path, uint8_t out[32])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(12, "trusted key '%s' cannot be read%s", path, "");
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    if (n == 32) {
        memcpy(out, text, 32);
        return 0;
    }
    const char *begin = strstr(text, "-----BEGIN PUBLIC KEY-----");
    uint8_t der[96];
    size_t k = 0;
    unsigned acc = 0;
    int bits = 0;
    if (begin) {
        for (const char *c = begin + 26; *c && *c != '-' && k < sizeof der; c++) {
            int v = b64((unsigned char)*c);
            if (v < 0)
                continue;
            acc = acc << 6 | (unsigned)v;
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                der[k++] = (uint8_t)(acc >> bits);
            }
        }
    }
    static const uint8_t prefix[12] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70,
                                       0x03, 0x21, 0x00};
    if (k != 44 || memcmp(der, prefix, 12))
        return fail(12, "a trusted key is not an Ed25519 public key (%s)%s", path, "");
    memcpy(out, der + 12, 32);
    return 0;
}

/* The command line after the command's name, parsed by one table: which options a command
 * takes, and how many files after MODEL.mlc. */
enum { OPT_OUTPUT = 1, OPT_THREADS = 2, OPT_RUNS = 4, OPT_KEY = 8 };
static const struct {
    const char *flag, *alias;
    unsigned bit;
    const char *value; /* what the usage error names when the value is missing */
} OPTIONS[] = {
    {"-o", "--output", OPT_OUTPUT, "-o needs an OUTDIR"},
    {"--threads", NULL, OPT_THREADS, "--threads needs a value"},
    {"--runs", NULL, OPT_RUNS, "--runs needs a value"},
    {"--trusted-key", NULL, OPT_KEY, "--trusted-key needs a KEY.pub (at most 16)"},
};

#define MAX_FILES 64
typedef struct {
    const char *model, *outdir;
    const char *files[MAX_FILES]; /* after MODEL.mlc: the inputs of `run` */
    int nfiles, threads, runs;
    trusted keys;
} args;

/* 0, or the exit code after a one-line error. `allowed`: OPT_* bits; `max_files`: how many
 * files may follow MODEL.mlc; `needs` the usage error when MODEL.mlc is missing. */
static int parse_args(int argc, char **argv, unsigned allowed, int max_files, const char *name,
                      args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        size_t o = 0;
        while (o < sizeof OPTIONS / sizeof OPTIONS[0]
               && (!(allowed & OPTIONS[o].bit)
                   || (strcmp(arg, OPTIONS[o].flag)
                       && !(OPTIONS[o].alias && !strcmp(arg, OPTIONS[o].alias)))))
            o++;
        if (o == sizeof OPTIONS / sizeof OPTIONS[0]) {
            if (arg[0] == '-' && arg[1])
                return usage("unknown option");
            if (!a->model)
                a->model = arg;
            else if (a->nfiles < max_files)
                a->files[a->nfiles++] = arg;
            else if (max_files)
                return usage("too many inputs");
            else {
                char why[64];
                snprintf(why, sizeof why, "%s takes one MODEL.mlc", name);
                return usage(why);
            }
            continue;
        }
        if (++i >= argc || (OPTIONS[o].bit == OPT_KEY && a->keys.count >= 16))
            return usage(OPTIONS[o].value);
        switch (OPTIONS[o].bit) {
        case OPT_OUTPUT: a->outdir = argv[i]; break;
        case OPT_THREADS: if (parse_positive(argv[i], arg, &a->threads)) return 2; break;
        case OPT_RUNS: if (parse_positive(argv[i], arg, &a->runs)) return 2; break;
        default: {
            int rc = read_key(argv[i], a->keys.keys[a->keys.count++]);
            if (rc)
                return rc;
        }
        }
    }
    if (!a->model) {
        char why[64];
        snprintf(why, sizeof why, "%s needs MODEL.mlc", name);
        return usage(why);
    }
    return 0;
}

static void options_from_env(mlc_options *o, int threads)
{
    mlc_options_init(o);
    o->cpu_features = getenv("MLCPACK_CPU_FEATURES");
    o->cpu_arch = getenv("MLCPACK_CPU_ARCH");
    if (threads > 0) {
        o->threads = threads;
    } else {
        const char *env = getenv("MLCPACK_NUM_THREADS");
        o->threads = env && atoi(env) > 0 ? atoi(env) : 1;
    }
}

static int open_model(const char *path, int threads, const trusted *keys, mlc_model **m)
{
    mlc_options o;
    mlc_error err;
    options_from_env(&o, threads);
    if (keys && keys->count) {
        o.trusted_keys = keys->keys;
        o.trusted_key_count = keys->count;
        o.require_signature = 1;
    }
    mlc_status s = mlc_open_file(path, &o, m, &err);
    if (s)
        return fail((int)s, "%s%s", err.message, "");
    return 0;
}

static void dims_text(const mlc_tensor_info *t, char *out, size_t size)
{
    size_t len = (size_t)snprintf(out, size, "[");
    for (int i = 0; i < t->ndim && len < size; i++) {
        if (t->dims[i] < 0)
            len += (size_t)snprintf(out + len, size - len, "%s%s", i ? ", " : "",
                                    t->dim_names[i] ? t->dim_names[i] : "?");
        else
            len += (size_t)snprintf(out + len, size - len, "%s%lld", i ? ", " : "",
                                    (long long)t->dims[i]);
    }
    if (len < size)
        snprintf(out + len, size - len, "]");
}

static size_t tensor_bytes(const mlc_tensor *t)
{
    size_t n = mlc_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->dims[i];
    return n;
}

static void free_tensors(mlc_tensor in[64], mlc_tensor out[64])
{
    for (int i = 0; i < 64; i++) {
        free(in[i].data);
        free(out[i].data);
    }
}

static int cmd_run(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, OPT_OUTPUT | OPT_THREADS | OPT_KEY, MAX_FILES, "run", &a);
    if (rc)
        return rc;
    if (!a.outdir)
        return usage("run needs MODEL.mlc, its inputs and -o OUTDIR");
    const char *model_path = a.model, *outdir = a.outdir, **inputs = a.files;
    int nin = a.nfiles;
    struct stat st;
    if (stat(outdir, &st) == 0 && !S_ISDIR(st.st_mode))
        return fail(2, "-o %s is a file, not a folder%s", outdir, "");
    mlc_model *m;
    if ((rc = open_model(model_path, a.threads, &a.keys, &m)))
        return rc;
    size_t n_in = mlc_input_count(m), n_out = mlc_output_count(m);
    mlc_tensor in[64], out[64];
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    char why[600];
    mlc_error err;
    if ((size_t)nin != n_in) {
        char text[160];
        snprintf(text, sizeof text, "%s takes %zu input(s), got %d", model_path, n_in, nin);
        rc = fail(7, "%s%s", text, "");
        goto done;
    }
    for (int i = 0; i < nin; i++)
        if (npy_read(inputs[i], &in[i], why, sizeof why)) {
            rc = fail(7, "%s%s", why, "");
            goto done;
        }
    for (size_t i = 0; i < n_out && i < 64; i++) {
        size_t need;
        mlc_status s = mlc_output_nbytes(m, i, in, n_in, &need, &err);
        if (s) {
            rc = fail((int)s, "%s%s", err.message, "");
            goto done;
        }
        /* 64-byte aligned, so the kernels may write it in place (zero-copy) */
        out[i].data = aligned_alloc(64, (need + 63) / 64 * 64 + 64);
        out[i].nbytes = need;
    }
    mlc_status s = mlc_run(m, in, n_in, out, n_out, &err);
    if (s) {
        rc = fail((int)s, "%s%s", err.message, "");
        goto done;
    }
    if (stat(outdir, &st) != 0 && mkdir(outdir, 0777) != 0) {
        rc = fail(2, "-o %s: the folder cannot be created (%s)", outdir, strerror(errno));
        goto done;
    }
    for (size_t i = 0; i < n_out; i++) {
        char path[4096];
        mlc_tensor_info info;
        mlc_output_info(m, i, &info);
        snprintf(path, sizeof path, "%s/out%zu.npy", outdir, i);
        out[i].nbytes = tensor_bytes(&out[i]);
        if (npy_write(path, &out[i], why, sizeof why)) {
            rc = fail(7, "%s%s", why, "");
            goto done;
        }
        char dims[256];
        mlc_tensor_info shown = info;
        shown.ndim = out[i].ndim;
        memcpy(shown.dims, out[i].dims, sizeof shown.dims);
        dims_text(&shown, dims, sizeof dims);
        printf("out%zu.npy: %s %s %s\n", i, info.name, dims, mlc_dtype_name(out[i].dtype));
    }
done:
    free_tensors(in, out);
    mlc_close(m);
    return rc;
}

static int cmd_verify(int argc, char **argv)
{
    args a;
    mlc_model *m;
    int rc = parse_args(argc, argv, OPT_THREADS | OPT_KEY, 0, "verify", &a);
    if (rc || (rc = open_model(a.model, a.threads, &a.keys, &m)))
        return rc;
    char summary[1024];
    mlc_error err;
    mlc_status s = mlc_verify(m, summary, sizeof summary, &err);
    if (summary[0])
        printf("%s\n", summary);
    if (s == MLC_OK)
        printf("PASS\n");
    else if (s == MLC_ERR_MISMATCH)
        printf("FAIL\n");
    fflush(stdout);
    mlc_close(m);
    if (s)
        return fail((int)s, "%s%s", err.message, "");
    return 0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Deterministic inputs: floats in [0, 1), integers 0..3 (xorshift) */
static void fill(mlc_tensor *t)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;
    size_t n = t->nbytes / mlc_dtype_size(t->dtype);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double v = (double)(x >> 11) / 9007199254740992.0;
        switch (t->dtype) {
        case MLC_FLOAT32: ((float *)t->data)[i] = (float)v; break;
        case MLC_FLOAT64: ((double *)t->data)[i] = v; break;
        case MLC_INT32: ((int32_t *)t->data)[i] = (int32_t)(x & 3); break;
        case MLC_INT64: ((int64_t *)t->data)[i] = (int64_t)(x & 3); break;
        default: memset((char *)t->data + i * mlc_dtype_size(t->dtype), (int)(x & 1),
                        mlc_dtype_size(t->dtype));
        }
    }
}

/* From /proc/self (Linux), in KiB: the process's peak resident memory, and how much of the
 * bundle's file mapping is resident (every page: the digest reads them all). 0 where unknown. */
static void memory_kib(const char *bundle, long *peak, long *mapped)
{
    *peak = *mapped = 0;
    char line[4352], want[4096];
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            *peak = atol(line + 6);
    fclose(f);
    if (!realpath(bundle, want) || !(f = fopen("/proc/self/smaps", "r")))
        return;
    int inside = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line), w = strlen(want);
        if (strchr(line, '-') && strchr(line, '-') < strchr(line, ' ')) /* a mapping's header */
            inside = n > w && !strncmp(line + n - w - 1, want, w) && line[n - w - 2] == ' ';
        else if (inside && !strncmp(line, "Rss:", 4))
            *mapped += atol(line + 4);
    }
    fclose(f);
}

static int cmd_bench(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, OPT_THREADS | OPT_RUNS, 0, "bench", &a);
    if (rc)
        return rc;
    const char *path = a.model;
    int threads = a.threads ? a.threads : 1, runs = a.runs;
    double t0 = now_us();
    mlc_model *m;
    if ((rc = open_model(path, threads, NULL, &m)))
        return rc;
    double load_ms = (now_us() - t0) / 1e3;
    size_t nin = mlc_input_count(m), nout = mlc_output_count(m);
    mlc_tensor in[64], out[64];
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    mlc_error err;
    for (size_t i = 0; i < nin && i < 64; i++) {
        mlc_tensor_info info;
        mlc_input_info(m, i, &info);
        in[i].dtype = info.dtype;
        in[i].ndim = info.ndim;
        for (int d = 0; d < info.ndim; d++)
            in[i].dims[d] = info.dims[d] < 0 ? 1 : info.dims[d];
        in[i].nbytes = tensor_bytes(&in[i]);
        in[i].data = malloc(in[i].nbytes ? in[i].nbytes : 1);
        fill(&in[i]);
    }
    for (size_t i = 0; i < nout && i < 64; i++) {
        size_t need = 0;
        mlc_output_nbytes(m, i, in, nin, &need, &err);
        out[i].data = malloc(need ? need : 1);
        out[i].nbytes = need;
    }
    t0 = now_us();
    mlc_status s = mlc_run(m, in, nin, out, nout, &err);
    double first_ms = (now_us() - t0) / 1e3;
    double *times = NULL;
    int n = 0;
    if (!s) {
        int cap = runs ? runs : 1 << 20;
        times = malloc(sizeof(double) * (size_t)cap);
        double start = now_us();
        while (n < cap && (runs || n < 5 || now_us() - start < 1e6)) {
            double t = now_us();
            s = mlc_run(m, in, nin, out, nout, &err);
            times[n++] = now_us() - t;
            if (s)
                break;
        }
    }
    if (s) {
        rc = fail((int)s, "%s%s", err.message, "");
    } else {
        qsort(times, (size_t)n, sizeof *times, by_value);
        const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        printf("%s: load %.2f ms, first %.2f ms, p50 %.2f us, p90 %.2f us, p99 %.2f us, min %.2f "
               "us (%d runs, %d thread%s)\n", name, load_ms, first_ms, times[n / 2],
               times[(int)(n * 0.9)], times[(int)(n * 0.99)], times[0], n, threads,
               threads > 1 ? "s" : "");
        long peak, mapped;
        mlc_model_facts f;
        mlc_model_facts_get(m, &f);
        memory_kib(path, &peak, &mapped);
        if (peak)
            printf("memory: peak RSS %ld KiB; the bundle's pages resident %ld KiB, "
                   "arena %zu KiB, code %zu KiB\n", peak, mapped,
                   (f.arena_bytes + 1023) / 1024, (f.code_bytes + 1023) / 1024);
    }
    free(times);
    free_tensors(in, out);
    mlc_close(m);
    return rc;
}

static int cmd_inspect(int argc, char **argv)
{
    args a;
    mlc_model *m;
    int rc = parse_args(argc, argv, 0, 0, "inspect", &a);
    if (rc || (rc = open_model(a.model, 1, NULL, &m)))
        return rc;
    mlc_model_facts f;
    mlc_model_facts_get(m, &f);
    printf("%s: format %d.%d, code %s (%s, %zu variant%s), arena %zu bytes, code %zu bytes, "
           "%zu instructions%s\n", a.model, f.format_major, f.format_minor, f.level, f.arch,
           f.variants, f.variants == 1 ? "" : "s", f.arena_bytes, f.code_bytes, f.instructions,
           f.signed_bundle ? ", signed" : "");
    if (f.inputs_in_place || f.outputs_in_place)
        printf("zero-copy: %zu input%s read in place, %zu output%s written in place\n",
               f.inputs_in_place, f.inputs_in_place == 1 ? "" : "s", f.outputs_in_place,
               f.outputs_in_place == 1 ? "" : "s");
    if (f.symbolic)
        printf("symbolic shapes: memory planned %s\n",
               f.arena_bytes ? "once, for the --max-shape bound" : "per input shape");
    if (f.plans > 1) {
        printf("%s", f.symbolic ? "static plans for batch" : "plans for batch");
        for (size_t p = f.symbolic ? 1 : 0; p < f.plans; p++)
            printf(" %lld", (long long)f.batch_sizes[p]);
        printf("\n");
    }
    for (int kind = 0; kind < 2; kind++) {
        size_t n = kind ? mlc_output_count(m) : mlc_input_count(m);
        for (size_t i = 0; i < n; i++) {
            mlc_tensor_info info;
            char dims[256];
            if (kind)
                mlc_output_info(m, i, &info);
            else
                mlc_input_info(m, i, &info);
            dims_text(&info, dims, sizeof dims);
            printf("%s %zu: %s %s %s\n", kind ? "output" : "input", i, info.name, dims,
                   mlc_dtype_name(info.dtype));
        }
    }
    mlc_close(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("mlcrun (libmlcrt %s)\n", mlc_version());
        return 0;
    }
    if (!strcmp(argv[1], "run"))
        return cmd_run(argc - 2, argv + 2);
    if (!strcmp(argv[1], "verify"))
        return cmd_verify(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench"))
        return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(argv[1], "inspect"))
        return cmd_inspect(argc - 2, argv + 2);
    return usage("unknown command (run, verify, bench, inspect)");
}
