/* CPU features and code-variant choice: the level table, flag names and choice rule of
 * runtime/cpu.py. Features come from cpuid/xgetbv on x86-64 (in /proc/cpuinfo naming, with
 * the AVX and AVX-512 flags cleared when the OS does not save their registers, as Linux does)
 * and from the auxiliary vector on AArch64; the caller may name them instead
 * (mlc_options.cpu_features, what MLCPACK_CPU_FEATURES is to the Python runtime). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>

#include "internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

typedef struct {
    const char *name, *arch, *flags;   /* flags added to the previous level of the same arch */
} level_row;

static const level_row LEVELS[] = {
    {"x86-64", "x86_64", "fpu cx8 cmov fxsr mmx sse sse2"},
    {"x86-64-v2", "x86_64", "cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3 pni"},
    {"x86-64-v3", "x86_64", "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"},
    {"x86-64-v4", "x86_64", "avx512f avx512bw avx512cd avx512dq avx512vl"},
    {"x86-64-v4+vnni", "x86_64", "avx512_vnni"},
    {"x86-64-v4+bf16", "x86_64", "avx512_bf16"},
    {"aarch64", "aarch64", "asimd fp"},
    {"aarch64+dotprod", "aarch64", "asimddp"},
};
#define NLEVELS (sizeof LEVELS / sizeof LEVELS[0])

static const char *const ALIASES[][2] = {
    {"sse3", "pni"}, {"lzcnt", "abm"}, {"sse4.1", "sse4_1"}, {"sse4.2", "sse4_2"},
    {"bmi", "bmi1"}, {"neon", "asimd"}, {"dotprod", "asimddp"}, {"fp-armv8", "fp"}};

/* A flag in cpuinfo naming, lowercased and de-aliased, into out (size 64). */
static void normalize(const char *s, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k < 63; i++)
        out[k++] = (char)tolower((unsigned char)s[i]);
    out[k] = 0;
    for (size_t a = 0; a < sizeof ALIASES / sizeof ALIASES[0]; a++)
        if (strcmp(out, ALIASES[a][0]) == 0) {
            strcpy(out, ALIASES[a][1]);
            break;
        }
}

static void normalize_arch(const char *s, char *out, size_t size)
{
    char buf[64];
    size_t k = 0;
    while (*s && isspace((unsigned char)*s))
        s++;
    for (; *s && k < sizeof buf - 1; s++)
        buf[k++] = (char)tolower((unsigned char)*s);
    while (k && isspace((unsigned char)buf[k - 1]))
        k--;
    buf[k] = 0;
    const char *v = buf;
    if (!strcmp(buf, "amd64") || !strcmp(buf, "x64"))
        v = "x86_64";
    else if (!strcmp(buf, "arm64") || !strcmp(buf, "armv8"))
        v = "aarch64";
    size_t n = strlen(v) < size - 1 ? strlen(v) : size - 1;
    memcpy(out, v, n);
    out[n] = 0;
}

const char *mlc_real_arch(void)
{
#if defined(__x86_64__)
    return "x86_64";
#elif defined(__aarch64__)
    return "aarch64";
#else
    return "unknown";
#endif
}

/* Append each whitespace/comma-separated flag of `list`, normalized, to buf. */
static void add_flags(char *buf, size_t size, const char *list)
{
    const char *p = list;
    while (*p) {
        while (*p && (isspace((unsigned char)*p) || *p == ','))
            p++;
        const char *s = p;
        while (*p && !isspace((unsigned char)*p) && *p != ',')
            p++;
        if (p > s) {
            char flag[64];
            normalize(s, (size_t)(p - s), flag);
            size_t len = strlen(buf);
            snprintf(buf + len, size - len, " %s", flag);
        }
    }
}

#if defined(__x86_64__)
static void detect(char *buf, size_t size)
{
    unsigned a, b, c, d, max;
    char list[1024] = "";
    const char *names[96] = {0};
    size_t n = 0;
#define HAS(reg, bit, name) if ((reg) >> (bit) & 1) names[n++] = (name)
    max = __get_cpuid_max(0, NULL);
    if (max >= 1) {
        __cpuid(1, a, b, c, d);
        HAS(d, 0, "fpu"); HAS(d, 8, "cx8"); HAS(d, 15, "cmov"); HAS(d, 23, "mmx");
        HAS(d, 24, "fxsr"); HAS(d, 25, "sse"); HAS(d, 26, "sse2");
        HAS(c, 0, "pni"); HAS(c, 1, "pclmulqdq"); HAS(c, 9, "ssse3"); HAS(c, 13, "cx16");
        HAS(c, 19, "sse4_1"); HAS(c, 20, "sse4_2"); HAS(c, 22, "movbe"); HAS(c, 23, "popcnt");
        HAS(c, 25, "aes"); HAS(c, 26, "xsave"); HAS(c, 30, "rdrand");
        int osxsave = c >> 27 & 1;
        unsigned long long xcr0 = 0;
        if (osxsave) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            xcr0 = (unsigned long long)hi << 32 | lo;
        }
        int avx_os = (xcr0 & 6) == 6, avx512_os = avx_os && (xcr0 & 0xE0) == 0xE0;
        if (avx_os) {
            HAS(c, 12, "fma"); HAS(c, 28, "avx"); HAS(c, 29, "f16c");
        }
        if (max >= 7) {
            __cpuid_count(7, 0, a, b, c, d);
            HAS(b, 3, "bmi1"); HAS(b, 8, "bmi2"); HAS(b, 19, "adx"); HAS(b, 29, "sha_ni");
            if (avx_os) {
                HAS(b, 5, "avx2"); HAS(c, 9, "vaes"); HAS(c, 10, "vpclmulqdq");
                HAS(c, 8, "gfni");
            }
            if (avx512_os) {
                HAS(b, 16, "avx512f"); HAS(b, 17, "avx512dq"); HAS(b, 21, "avx512ifma");
                HAS(b, 28, "avx512cd"); HAS(b, 30, "avx512bw"); HAS(b, 31, "avx512vl");
                HAS(c, 1, "avx512vbmi"); HAS(c, 6, "avx512_vbmi2"); HAS(c, 11, "avx512_vnni");
                HAS(c, 12, "avx512_bitalg"); HAS(c, 14, "avx512_vpopcntdq");
                HAS(d, 23, "avx512_fp16");
            }
            unsigned max7 = a;
            if (max7 >= 1) {
                __cpuid_count(7, 1, a, b, c, d);
                if (avx_os) {
                    HAS(a, 4, "avx_vnni");
                }
                if (avx512_os) {
                    HAS(a, 5, "avx512_bf16");
                }
            }
        }
    }
    if (__get_cpuid_max(0x80000000, NULL) >= 0x80000001) {
        __cpuid(0x80000001, a, b, c, d);
        HAS(c, 0, "lahf_lm"); HAS(c, 5, "abm");
    }
#undef HAS
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, " %s", names[i]);
    }
    add_flags(buf, size, list);
}
#elif defined(__aarch64__) && defined(__linux__)
static void detect(char *buf, size_t size)
{
    static const struct { int bit; const char *name; } hw[] = {
        {0, "fp"}, {1, "asimd"}, {3, "aes"}, {4, "pmull"}, {5, "sha1"}, {6, "sha2"},
        {7, "crc32"}, {8, "atomics"}, {9, "fphp"}, {10, "asimdhp"}, {12, "asimdrdm"},
        {13, "jscvt"}, {14, "fcma"}, {15, "lrcpc"}, {17, "sha3"}, {20, "asimddp"},
        {21, "sha512"}, {22, "sve"}, {23, "asimdfhm"}};
    static const struct { int bit; const char *name; } hw2[] = {
        {1, "sve2"}, {13, "i8mm"}, {14, "bf16"}};
    unsigned long caps = getauxval(AT_HWCAP), caps2 = getauxval(AT_HWCAP2);
    for (size_t i = 0; i < sizeof hw / sizeof hw[0]; i++)
        if (caps >> hw[i].bit & 1)
            add_flags(buf, size, hw[i].name);
    for (size_t i = 0; i < sizeof hw2 / sizeof hw2[0]; i++)
        if (caps2 >> hw2[i].bit & 1)
            add_flags(buf, size, hw2[i].name);
}
#else
static void detect(char *buf, size_t size)
{
    (void)buf;
    (void)size;
}
#endif

mlc_status mlc_cpu_host(mlc_cpu *cpu, const char *arch_override, const char *features_override,
                        mlc_alloc *a, mlc_error *err)
{
    normalize_arch(arch_override ? arch_override : mlc_real_arch(), cpu->arch, sizeof cpu->arch);
    size_t size = 2048 + (features_override ? 2 * strlen(features_override) : 0);
    cpu->flags = mlc_zalloc(a, size);
    if (!cpu->flags)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    if (features_override)
        add_flags(cpu->flags, size, features_override);
    else
        detect(cpu->flags, size);
    size_t len = strlen(cpu->flags);
    snprintf(cpu->flags + len, size - len, " ");
    return MLC_OK;
}

int mlc_cpu_has(const mlc_cpu *cpu, const char *flag)
{
    char needle[80];
    snprintf(needle, sizeof needle, " %s ", flag);
    return strstr(cpu->flags, needle) != NULL;
}

/* Every flag of level index i (its own and those of the levels below it), space-separated. */
static void level_flags(size_t i, char *out, size_t size)
{
    out[0] = 0;
    for (size_t k = 0; k <= i; k++)
        if (!strcmp(LEVELS[k].arch, LEVELS[i].arch)) {
            size_t len = strlen(out);
            snprintf(out + len, size - len, " %s", LEVELS[k].flags);
        }
}

static int has_all(const mlc_cpu *cpu, const char *flags)
{
    const char *p = flags;
    char flag[64];
    while (*p) {
        while (*p == ' ')
            p++;
        const char *s = p;
        while (*p && *p != ' ')
            p++;
        if (p > s) {
            snprintf(flag, sizeof flag, "%.*s", (int)(p - s), s);
            if (!mlc_cpu_has(cpu, flag))
                return 0;
        }
    }
    return 1;
}

const char *mlc_cpu_best_level(const mlc_cpu *cpu)
{
    const char *best = NULL;
    char flags[512];
    for (size_t i = 0; i < NLEVELS; i++) {
        if (strcmp(LEVELS[i].arch, cpu->arch))
            continue;
        level_flags(i, flags, sizeof flags);
        if (has_all(cpu, flags))
            best = LEVELS[i].name;
    }
    return best;
}

/* The distinct flags a variant needs (level's plus its extras), space-separated with spaces
 * around each; returns their count, or -1 when the level is unknown and there are no extras. */
static int needs(const mlc_variant_req *v, const char *arch, char *out, size_t size, long *rank)
{
    char all[1536] = "";
    *rank = -1;
    for (size_t i = 0; i < NLEVELS; i++)
        if (!strcmp(LEVELS[i].name, v->level) && !strcmp(LEVELS[i].arch, arch)) {
            level_flags(i, all, sizeof all);
            *rank = (long)i;
        }
    if (*rank < 0 && v->nfeatures == 0)
        return -1;
    for (size_t i = 0; i < v->nfeatures; i++)
        add_flags(all, sizeof all, v->features[i]);
    /* dedupe */
    snprintf(out, size, " ");
    int count = 0;
    const char *p = all;
    while (*p) {
        while (*p == ' ')
            p++;
        const char *s = p;
        while (*p && *p != ' ')
            p++;
        if (p > s) {
            char needle[80];
            snprintf(needle, sizeof needle, " %.*s ", (int)(p - s), s);
            if (!strstr(out, needle)) {
                size_t len = strlen(out);
                snprintf(out + len, size - len, "%.*s ", (int)(p - s), s);
                count++;
            }
        }
    }
    return count;
}

static void advice(const mlc_cpu *cpu, int same_arch, char *out, size_t size)
{
    const char *best = mlc_cpu_best_level(cpu);
    if (!best)
        snprintf(out, size, "this %s CPU cannot run mlcpack code", cpu->arch);
    else if (!same_arch)
        snprintf(out, size, "export again with --target %s", best);
    else
        snprintf(out, size, "export again with --target %s or the default portable target",
                 best);
}

long mlc_cpu_pick(const mlc_cpu *cpu, const mlc_variant_req *v, size_t n, const char *name,
                  mlc_error *err)
{
    long best = -1, best_count = -1, best_rank = -1;
    char reasons[384] = "";
    int same_arch = 0;
    for (size_t i = 0; i < n; i++) {
        char arch[16], need[1536], why[256];
        long rank;
        normalize_arch(v[i].arch, arch, sizeof arch);
        why[0] = 0;
        if (!strcmp(arch, cpu->arch))
            same_arch = 1;
        if (strcmp(arch, cpu->arch)) {
            snprintf(why, sizeof why, "%s is for %s machines", v[i].level, arch);
        } else {
            int count = needs(&v[i], arch, need, sizeof need, &rank);
            if (count < 0) {
                snprintf(why, sizeof why, "%s is unknown to this runtime", v[i].level);
            } else {
                /* missing flags, sorted as Python sorts them */
                const char *missing[64];
                size_t nm = 0;
                char copy[1536];
                snprintf(copy, sizeof copy, "%s", need);
                for (char *tok = strtok(copy, " "); tok; tok = strtok(NULL, " "))
                    if (!mlc_cpu_has(cpu, tok) && nm < 64)
                        missing[nm++] = tok;
                if (nm) {
                    for (size_t x = 1; x < nm; x++)
                        for (size_t y = x; y > 0 && strcmp(missing[y - 1], missing[y]) > 0; y--) {
                            const char *t = missing[y];
                            missing[y] = missing[y - 1];
                            missing[y - 1] = t;
                        }
                    size_t len = (size_t)snprintf(why, sizeof why, "%s needs ", v[i].level);
                    for (size_t x = 0; x < nm && len < sizeof why; x++)
                        len += (size_t)snprintf(why + len, sizeof why - len, "%s%s",
                                                x ? ", " : "", missing[x]);
                } else if (count > best_count || (count == best_count && rank > best_rank)) {
                    best = (long)i;
                    best_count = count;
                    best_rank = rank;
                }
            }
        }
        if (why[0]) {
            size_t len = strlen(reasons);
            snprintf(reasons + len, sizeof reasons - len, "%s%s", len ? "; " : "", why);
        }
    }
    if (best < 0) {
        char adv[160], host[160];
        const char *lv = mlc_cpu_best_level(cpu);
        advice(cpu, same_arch, adv, sizeof adv);
        if (lv)
            snprintf(host, sizeof host, "this CPU is %s", lv);
        else
            snprintf(host, sizeof host, "this %s CPU lacks even the baseline level", cpu->arch);
        mlc_fail(err, MLC_ERR_CPU, "no code in %s runs on this %s CPU (%s); %s: %s", name,
                 cpu->arch, reasons[0] ? reasons : "it has no code variants", host, adv);
    }
    return best;
}
