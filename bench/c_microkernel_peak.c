/* The packed 1x1 convolution's 4 x 24 register tile, alone, against the register-only FMA loop
 * (bench/conv_peak.py's): is the product loop what keeps the 1x1 layers under 90 % of the FMA
 * peak? Both loops are written in assembly (the compiler cannot reschedule or vectorize them):
 * the tile is the generated kernel's inner loop instruction for instruction (3 panel loads, 4
 * weight broadcasts, 12 FMAs, 2 pointer steps and a counter per input channel; see
 * docs/performance.md, "1x1 convolutions against the FMA peak"), then its 12 accumulators
 * stored once per block. x86-64 with AVX2 and FMA only.
 *
 *   cc -O2 -mavx2 -mfma bench/c_microkernel_peak.c -o ukpeak
 *   ./ukpeak [ROUNDS]                        sweep: K, reduction chunks, panel in L1 or L2
 *   ./ukpeak K PANELS BLOCKS CHUNK [ROUNDS]  one layer's loop nest: CHUNK block rows (their
 *                                            weights, K x 4 floats each, stay in L2) over every
 *                                            packed panel ([K][24] floats), chunk by chunk
 *
 * 1 thread, CPU-time minimum over ROUNDS (default 7) timings of each case. The sweep runs each
 * K over 64 block rows of weights (fewer past 512 KB) against one panel, whole and in
 * reduction chunks of kc channels (the partial sums stored and reloaded between chunks, as a
 * K-blocked kernel would). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CLOBBER "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", \
    "ymm9", "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15", "memory", "cc"
#define ZERO12 \
    "vxorps %%ymm0, %%ymm0, %%ymm0\n\t" "vxorps %%ymm1, %%ymm1, %%ymm1\n\t" \
    "vxorps %%ymm2, %%ymm2, %%ymm2\n\t" "vxorps %%ymm3, %%ymm3, %%ymm3\n\t" \
    "vxorps %%ymm4, %%ymm4, %%ymm4\n\t" "vxorps %%ymm5, %%ymm5, %%ymm5\n\t" \
    "vxorps %%ymm6, %%ymm6, %%ymm6\n\t" "vxorps %%ymm7, %%ymm7, %%ymm7\n\t" \
    "vxorps %%ymm8, %%ymm8, %%ymm8\n\t" "vxorps %%ymm9, %%ymm9, %%ymm9\n\t" \
    "vxorps %%ymm10, %%ymm10, %%ymm10\n\t" "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
#define LOAD12 \
    "vmovups (%[o]), %%ymm0\n\t" "vmovups 32(%[o]), %%ymm1\n\t" "vmovups 64(%[o]), %%ymm2\n\t" \
    "vmovups 96(%[o]), %%ymm3\n\t" "vmovups 128(%[o]), %%ymm4\n\t" \
    "vmovups 160(%[o]), %%ymm5\n\t" "vmovups 192(%[o]), %%ymm6\n\t" \
    "vmovups 224(%[o]), %%ymm7\n\t" "vmovups 256(%[o]), %%ymm8\n\t" \
    "vmovups 288(%[o]), %%ymm9\n\t" "vmovups 320(%[o]), %%ymm10\n\t" \
    "vmovups 352(%[o]), %%ymm11\n\t"
#define STORE12 \
    "vmovups %%ymm0, (%[o])\n\t" "vmovups %%ymm1, 32(%[o])\n\t" "vmovups %%ymm2, 64(%[o])\n\t" \
    "vmovups %%ymm3, 96(%[o])\n\t" "vmovups %%ymm4, 128(%[o])\n\t" \
    "vmovups %%ymm5, 160(%[o])\n\t" "vmovups %%ymm6, 192(%[o])\n\t" \
    "vmovups %%ymm7, 224(%[o])\n\t" "vmovups %%ymm8, 256(%[o])\n\t" \
    "vmovups %%ymm9, 288(%[o])\n\t" "vmovups %%ymm10, 320(%[o])\n\t" \
    "vmovups %%ymm11, 352(%[o])\n\t"
#define ROW(off, a, b, c) \
    "vbroadcastss " #off "(%[w]), %%ymm15\n\t" \
    "vfmadd231ps %%ymm12, %%ymm15, %%ymm" #a "\n\t" \
    "vfmadd231ps %%ymm13, %%ymm15, %%ymm" #b "\n\t" \
    "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #c "\n\t"
#define FMA_R(i) "vfmadd231ps %%ymm12, %%ymm13, %%ymm" #i "\n\t"

/* 12 independent FMA chains in registers: 12 x 8 x 2 FLOP per iteration. */
__attribute__((noinline)) static void fma_reg(long n, float *o)
{
    __asm__ volatile(ZERO12 "vxorps %%ymm12, %%ymm12, %%ymm12\n\t"
                     "vxorps %%ymm13, %%ymm13, %%ymm13\n\t"
                     "1:\n\t" FMA_R(0) FMA_R(1) FMA_R(2) FMA_R(3) FMA_R(4) FMA_R(5) FMA_R(6)
                     FMA_R(7) FMA_R(8) FMA_R(9) FMA_R(10) FMA_R(11)
                     "dec %[n]\n\t" "jnz 1b\n\t" STORE12
                     : [n] "+r"(n) : [o] "r"(o) : CLOBBER);
}

/* One 4 x 24 block over K input channels: panel p [K][24], weights w [K][4], the tile to o
 * (from o's values when init, else from zero). */
__attribute__((noinline)) static void tile_4x24(long K, const float *p, const float *w,
                                                float *o, int init)
{
    if (init)
        __asm__ volatile(LOAD12 : : [o] "r"(o) : CLOBBER);
    else
        __asm__ volatile(ZERO12 : : : CLOBBER);
    __asm__ volatile("1:\n\t"
                     "vmovups (%[p]), %%ymm12\n\t" "vmovups 32(%[p]), %%ymm13\n\t"
                     "vmovups 64(%[p]), %%ymm14\n\t"
                     ROW(0, 0, 1, 2) ROW(4, 3, 4, 5) ROW(8, 6, 7, 8) ROW(12, 9, 10, 11)
                     "add $96, %[p]\n\t" "add $16, %[w]\n\t" "dec %[k]\n\t" "jnz 1b\n\t"
                     : [p] "+r"(p), [w] "+r"(w), [k] "+r"(K) : : CLOBBER);
    __asm__ volatile(STORE12 : : [o] "r"(o) : CLOBBER);
}

static double fma_peak(int rounds)
{
    static float o[96];
    long n = 1L << 22;
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t = now();
        fma_reg(n, o);
        t = now() - t;
        if (t < best)
            best = t;
    }
    return 12.0 * 8 * 2 * (double)n / best / 1e9;
}

static float *filled(size_t n, int mod)
{
    float *v = aligned_alloc(64, (n * sizeof(float) + 127) / 64 * 64);
    if (!v) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        v[i] = 1e-3f * (float)(i % (size_t)mod);
    return v;
}

/* GFLOP/s of CHUNK block rows at a time over every panel, chunk by chunk (kc: reduction
 * chunks; kc == K: whole); *peak: the FMA loop's, timed in the same rounds (alternating, so
 * that both see the same load on a shared core). */
static double layer(long K, long kc, int np, int nb, int cb, int rounds, double *peak)
{
    float *p = filled((size_t)np * K * 24, 7), *w = filled((size_t)nb * K * 4, 5);
    float *o = filled((size_t)nb * np * 96, 3);
    double flop = (double)np * nb * K * 192, best = 1e30;
    int reps = (int)(2e8 / flop) + 1;
    *peak = 0;
    for (int r = 0; r < rounds; r++) {
        double f = fma_peak(1);
        if (f > *peak)
            *peak = f;
        double t = now();
        for (int rep = 0; rep < reps; rep++)
            for (int c0 = 0; c0 < nb; c0 += cb)
                for (int jp = 0; jp < np; jp++)
                    for (long k0 = 0; k0 < K; k0 += kc)
                        for (int mb = c0; mb < c0 + cb && mb < nb; mb++)
                            tile_4x24(kc, p + (size_t)jp * K * 24 + 24 * k0,
                                      w + (size_t)mb * K * 4 + 4 * k0,
                                      o + ((size_t)mb * np + jp) * 96, k0 > 0);
        t = now() - t;
        if (t < best)
            best = t;
    }
    free(p);
    free(w);
    free(o);
    return (double)reps * flop / best / 1e9;
}

int main(int argc, char **argv)
{
    if (argc >= 5) {
        long K = atol(argv[1]);
        int np = atoi(argv[2]), nb = atoi(argv[3]), cb = atoi(argv[4]);
        int rounds = argc > 5 ? atoi(argv[5]) : 7;
        if (K < 1 || np < 1 || nb < 1 || cb < 1 || rounds < 1) {
            fprintf(stderr, "error: K PANELS BLOCKS CHUNK [ROUNDS] must be positive\n");
            return 2;
        }
        double peak, g = layer(K, K, np, nb, cb, rounds, &peak);
        printf("K %ld, %d panels (%ld KB), %d block rows in chunks of %d (%ld KB): "
               "FMA loop %.1f, tile %.1f GFLOP/s = %.1f %%\n", K, np, (long)np * K * 96 / 1024,
               nb, cb, (long)cb * K * 16 / 1024, peak, g, 100 * g / peak);
        return 0;
    }
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1) {
        fprintf(stderr, "error: ROUNDS must be positive\n");
        return 2;
    }
    printf("each case beside the FMA loop (12 chains, 1 thread) timed in the same rounds\n");
    const long ks[] = {64, 128, 256, 512, 1024, 2048};
    for (int i = 0; i < 6; i++) {
        long K = ks[i];
        int nb = (int)(512 * 1024 / (16 * K));
        if (nb > 64)
            nb = 64;
        const long kcs[] = {K, 256, 128, 64};
        for (int j = 0; j < 4; j++) {
            long kc = kcs[j];
            if (kc > K || (j > 0 && kc == K))
                continue;
            double peak, g = layer(K, kc, 1, nb, nb, rounds, &peak);
            printf("K %5ld  chunk %5ld  panel %4ld KB  %2d block rows  FMA loop %6.1f  "
                   "tile %6.1f GFLOP/s  %5.1f %%\n", K, kc, K * 96 / 1024, nb, peak, g,
                   100 * g / peak);
        }
    }
    return 0;
}
