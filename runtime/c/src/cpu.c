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
    {"aarch64+bf16", "aarch64", "bf16"},
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
/* Where each x86-64 flag lives: cpuid leaf / subleaf, register, bit, and the register state
 * the OS must save for it to be usable (Linux clears the flag otherwise). Adding a feature is
 * one row. */
enum { EAX, EBX, ECX, EDX };
enum { OS_NONE, OS_AVX, OS_AVX512 };
static const struct {
    unsigned leaf, sub;
    unsigned char reg, bit, os;
    const char *name;
} X86_FLAGS[] = {
    {1, 0, EDX, 0, OS_NONE, "fpu"}, {1, 0, EDX, 8, OS_NONE, "cx8"},
    {1, 0, EDX, 15, OS_NONE, "cmov"}, {1, 0, EDX, 23, OS_NONE, "mmx"},
    {1, 0, EDX, 24, OS_NONE, "fxsr"}, {1, 0, EDX, 25, OS_NONE, "sse"},
    {1, 0, EDX, 26, OS_NONE, "sse2"}, {1, 0, ECX, 0, OS_NONE, "pni"},
    {1, 0, ECX, 1, OS_NONE, "pclmulqdq"}, {1, 0, ECX, 9, OS_NONE, "ssse3"},
    {1, 0, ECX, 13, OS_NONE, "cx16"}, {1, 0, ECX, 19, OS_NONE, "sse4_1"},
    {1, 0, ECX, 20, OS_NONE, "sse4_2"}, {1, 0, ECX, 22, OS_NONE, "movbe"},
    {1, 0, ECX, 23, OS_NONE, "popcnt"}, {1, 0, ECX, 25, OS_NONE, "aes"},
    {1, 0, ECX, 26, OS_NONE, "xsave"}, {1, 0, ECX, 30, OS_NONE, "rdrand"},
    {1, 0, ECX, 12, OS_AVX, "fma"}, {1, 0, ECX, 28, OS_AVX, "avx"},
    {1, 0, ECX, 29, OS_AVX, "f16c"},
    {7, 0, EBX, 3, OS_NONE, "bmi1"}, {7, 0, EBX, 8, OS_NONE, "bmi2"},
    {7, 0, EBX, 19, OS_NONE, "adx"}, {7, 0, EBX, 29, OS_NONE, "sha_ni"},
    {7, 0, EBX, 5, OS_AVX, "avx2"}, {7, 0, ECX, 9, OS_AVX, "vaes"},
    {7, 0, ECX, 10, OS_AVX, "vpclmulqdq"}, {7, 0, ECX, 8, OS_AVX, "gfni"},
    {7, 0, EBX, 16, OS_AVX512, "avx512f"}, {7, 0, EBX, 17, OS_AVX512, "avx512dq"},
    {7, 0, EBX, 21, OS_AVX512, "avx512ifma"}, {7, 0, EBX, 28, OS_AVX512, "avx512cd"},
    {7, 0, EBX, 30, OS_AVX512, "avx512bw"}, {7, 0, EBX, 31, OS_AVX512, "avx512vl"},
    {7, 0, ECX, 1, OS_AVX512, "avx512vbmi"}, {7, 0, ECX, 6, OS_AVX512, "avx512_vbmi2"},
    {7, 0, ECX, 11, OS_AVX512, "avx512_vnni"}, {7, 0, ECX, 12, OS_AVX512, "avx512_bitalg"},
    {7, 0, ECX, 14, OS_AVX512, "avx512_vpopcntdq"}, {7, 0, EDX, 23, OS_AVX512, "avx512_fp16"},
    {7, 1, EAX, 4, OS_AVX, "avx_vnni"}, {7, 1, EAX, 5, OS_AVX512, "avx512_bf16"},
    {0x80000001, 0, ECX, 0, OS_NONE, "lahf_lm"}, {0x80000001, 0, ECX, 5, OS_NONE, "abm"},
};

/* The four registers of cpuid(leaf, sub), or zeros when the CPU has no such leaf; max[0] and
 * max[1] are the highest basic and extended leaves, max[2] leaf 7's highest subleaf. Each
 * cpuid costs microseconds in a virtual machine (it traps), so each leaf is asked once. */
static void cpuid_regs(unsigned leaf, unsigned sub, const unsigned max[3], unsigned r[4])
{
    r[0] = r[1] = r[2] = r[3] = 0;
    if (leaf > max[leaf >> 31] || (leaf == 7 && sub > max[2]))
        return;
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}

static void detect(char *buf, size_t size)
{
    unsigned r[4], max[3] = {__get_cpuid_max(0, NULL), __get_cpuid_max(0x80000000u, NULL), 0};
    cpuid_regs(7, 0, max, r);
    max[2] = r[EAX];
    cpuid_regs(1, 0, max, r);
    unsigned long long xcr0 = 0;
    if (r[ECX] >> 27 & 1) { /* osxsave */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = (unsigned long long)hi << 32 | lo;
    }
    int avx_os = (xcr0 & 6) == 6;
    int os_ok[3] = {1, avx_os, avx_os && (xcr0 & 0xE0) == 0xE0};
    unsigned leaf = ~0u, sub = ~0u;
    for (size_t i = 0; i < sizeof X86_FLAGS / sizeof X86_FLAGS[0]; i++) {
        if (X86_FLAGS[i].leaf != leaf || X86_FLAGS[i].sub != sub) {
            leaf = X86_FLAGS[i].leaf;
            sub = X86_FLAGS[i].sub;
            cpuid_regs(leaf, sub, max, r);
        }
        if (os_ok[X86_FLAGS[i].os] && (r[X86_FLAGS[i].reg] >> X86_FLAGS[i].bit & 1))
            add_flags(buf, size, X86_FLAGS[i].name);
    }
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

/* The next space-separated word of *p (at most 63 bytes) into word; 0 when none is left. */
static int next_word(const char **p, char word[64])
{
    while (**p == ' ')
        (*p)++;
    const char *s = *p;
    while (**p && **p != ' ')
        (*p)++;
    snprintf(word, 64, "%.*s", (int)(*p - s), s);
    return *p > s;
}

static int has_all(const mlc_cpu *cpu, const char *flags)
{
    char flag[64];
    for (const char *p = flags; next_word(&p, flag);)
        if (!mlc_cpu_has(cpu, flag))
            return 0;
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
    char flag[64], needle[80];
    for (const char *p = all; next_word(&p, flag);) {
        snprintf(needle, sizeof needle, " %s ", flag);
        if (!strstr(out, needle)) {
            size_t len = strlen(out);
            snprintf(out + len, size - len, "%s ", flag);
            count++;
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
