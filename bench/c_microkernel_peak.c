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
 * K-blocked kernel would).
 *
 * With AVX-512 (compiled with -mavx512f), the channel-lane convolution's zmm tile too
 * (codegen/conv_oc.py at 16 lanes: 8 pixels x 2 zmm weight vectors, 16 accumulators; per
 * reduction step 2 weight loads, 8 pixel broadcasts, 16 FMAs, as the generated inner loop):
 *
 *   cc -O2 -mavx512f -mfma bench/c_microkernel_peak.c -o ukpeak
 *   ./ukpeak zmm C H W O SW [ROUNDS]         one 1x1 layer (C -> O channels, H x W input plane,
 *                                            column stride SW = 1 or 2, every row): its loop
 *                                            nest as the kernel runs it (blocks of 32 output
 *                                            channels, row groups of 16 KB of sums, chunks of
 *                                            144 input channels, 8-pixel tiles; a group's rest
 *                                            pixels in an overlapping last tile, counted as
 *                                            executed), beside the 16-lane FMA loop
 */
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

/* GFLOP/s of an FMA loop: n steps of 12 independent FMAs on `lanes` floats, the best of
   `rounds` timings */
static double peak_of(void (*loop)(long, float *), long n, int lanes, int rounds)
{
    static float o[96] __attribute__((aligned(64)));
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t = now();
        loop(n, o);
        t = now() - t;
        if (t < best)
            best = t;
    }
    return 12.0 * lanes * 2 * (double)n / best / 1e9;
}

static double fma_peak(int rounds)
{
    return peak_of(fma_reg, 1L << 22, 8, rounds);
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

#ifdef __AVX512F__
#define ZCLOBBER "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", \
    "zmm9", "zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15", "zmm16", "zmm17", "zmm18", \
    "zmm19", "zmm20", "zmm21", "zmm22", "zmm23", "zmm24", "zmm25", "memory", "cc"
#define ZR(i) "vfmadd231ps %%zmm16, %%zmm17, %%zmm" #i "\n\t"

/* 12 independent zmm FMA chains: 12 x 16 x 2 FLOP per iteration. */
__attribute__((noinline)) static void fma_reg512(long n, float *o)
{
    __asm__ volatile("vxorps %%zmm16, %%zmm16, %%zmm16\n\t" "vxorps %%zmm17, %%zmm17, %%zmm17\n\t"
                     "vmovups (%[o]), %%zmm0\n\t" "vmovaps %%zmm0, %%zmm1\n\t"
                     "vmovaps %%zmm0, %%zmm2\n\t" "vmovaps %%zmm0, %%zmm3\n\t"
                     "vmovaps %%zmm0, %%zmm4\n\t" "vmovaps %%zmm0, %%zmm5\n\t"
                     "vmovaps %%zmm0, %%zmm6\n\t" "vmovaps %%zmm0, %%zmm7\n\t"
                     "vmovaps %%zmm0, %%zmm8\n\t" "vmovaps %%zmm0, %%zmm9\n\t"
                     "vmovaps %%zmm0, %%zmm10\n\t" "vmovaps %%zmm0, %%zmm11\n\t"
                     "1:\n\t" ZR(0) ZR(1) ZR(2) ZR(3) ZR(4) ZR(5) ZR(6) ZR(7) ZR(8) ZR(9)
                     ZR(10) ZR(11) "dec %[n]\n\t" "jnz 1b\n\t"
                     "vaddps %%zmm1, %%zmm0, %%zmm0\n\t" "vmovups %%zmm0, (%[o])\n\t"
                     : [n] "+r"(n) : [o] "r"(o) : ZCLOBBER);
}

static double fma_peak512(int rounds)
{
    return peak_of(fma_reg512, 1L << 21, 16, rounds);
}

#define ZB(j, off) "vbroadcastss " #off "(%[x]), %%zmm" #j "\n\t"
#define ZF(j, a) "vfmadd231ps %%zmm" #j ", %%zmm24, %%zmm" #a "\n\t"
#define ZG(j, a) "vfmadd231ps %%zmm" #j ", %%zmm25, %%zmm" #a "\n\t"
#define ZSTEP_FMAS \
    ZF(16, 0) ZF(17, 2) ZF(18, 4) ZF(19, 6) ZF(20, 8) ZF(21, 10) ZF(22, 12) ZF(23, 14) \
    ZG(16, 1) ZG(17, 3) ZG(18, 5) ZG(19, 7) ZG(20, 9) ZG(21, 11) ZG(22, 13) ZG(23, 15)
#define ZACC(op) \
    op "0(%[o]), %%zmm0\n\t" op "64(%[o]), %%zmm1\n\t" op "128(%[o]), %%zmm2\n\t" \
    op "192(%[o]), %%zmm3\n\t" op "256(%[o]), %%zmm4\n\t" op "320(%[o]), %%zmm5\n\t" \
    op "384(%[o]), %%zmm6\n\t" op "448(%[o]), %%zmm7\n\t" op "512(%[o]), %%zmm8\n\t" \
    op "576(%[o]), %%zmm9\n\t" op "640(%[o]), %%zmm10\n\t" op "704(%[o]), %%zmm11\n\t" \
    op "768(%[o]), %%zmm12\n\t" op "832(%[o]), %%zmm13\n\t" op "896(%[o]), %%zmm14\n\t" \
    op "960(%[o]), %%zmm15\n\t"
#define ZSTORE(r, m) "vmovups %%zmm" #r ", " #m "(%[o])\n\t"

/* 8 pixels (columns sw apart from x) x 32 channels over K input channels (planes `stride`
 * bytes apart, weights w [K][32]), the sums to o [8][32] (from o when init, else zero). */
__attribute__((noinline)) static void tile_8x32(long K, const float *x, long stride,
                                                const float *w, float *o, int init, int sw)
{
    if (init)
        __asm__ volatile(ZACC("vmovups ") : : [o] "r"(o) : ZCLOBBER);
    else
        __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
                         "vmovaps %%zmm0, %%zmm1\n\t" "vmovaps %%zmm0, %%zmm2\n\t"
                         "vmovaps %%zmm0, %%zmm3\n\t" "vmovaps %%zmm0, %%zmm4\n\t"
                         "vmovaps %%zmm0, %%zmm5\n\t" "vmovaps %%zmm0, %%zmm6\n\t"
                         "vmovaps %%zmm0, %%zmm7\n\t" "vmovaps %%zmm0, %%zmm8\n\t"
                         "vmovaps %%zmm0, %%zmm9\n\t" "vmovaps %%zmm0, %%zmm10\n\t"
                         "vmovaps %%zmm0, %%zmm11\n\t" "vmovaps %%zmm0, %%zmm12\n\t"
                         "vmovaps %%zmm0, %%zmm13\n\t" "vmovaps %%zmm0, %%zmm14\n\t"
                         "vmovaps %%zmm0, %%zmm15\n\t" : : : ZCLOBBER);
    if (sw == 1)
        __asm__ volatile("1:\n\t"
                         ZB(16, 0) ZB(17, 4) ZB(18, 8) ZB(19, 12) ZB(20, 16) ZB(21, 20)
                         ZB(22, 24) ZB(23, 28)
                         "vmovups (%[w]), %%zmm24\n\t" "vmovups 64(%[w]), %%zmm25\n\t"
                         ZSTEP_FMAS
                         "add %[s], %[x]\n\t" "add $128, %[w]\n\t" "dec %[k]\n\t"
                         "jnz 1b\n\t"
                         : [x] "+r"(x), [w] "+r"(w), [k] "+r"(K) : [s] "r"(stride) : ZCLOBBER);
    else
        __asm__ volatile("1:\n\t"
                         ZB(16, 0) ZB(17, 8) ZB(18, 16) ZB(19, 24) ZB(20, 32) ZB(21, 40)
                         ZB(22, 48) ZB(23, 56)
                         "vmovups (%[w]), %%zmm24\n\t" "vmovups 64(%[w]), %%zmm25\n\t"
                         ZSTEP_FMAS
                         "add %[s], %[x]\n\t" "add $128, %[w]\n\t" "dec %[k]\n\t"
                         "jnz 1b\n\t"
                         : [x] "+r"(x), [w] "+r"(w), [k] "+r"(K) : [s] "r"(stride) : ZCLOBBER);
    __asm__ volatile(ZSTORE(0, 0) ZSTORE(1, 64) ZSTORE(2, 128) ZSTORE(3, 192) ZSTORE(4, 256)
                     ZSTORE(5, 320) ZSTORE(6, 384) ZSTORE(7, 448) ZSTORE(8, 512)
                     ZSTORE(9, 576) ZSTORE(10, 640) ZSTORE(11, 704) ZSTORE(12, 768)
                     ZSTORE(13, 832) ZSTORE(14, 896) ZSTORE(15, 960)
                     : : [o] "r"(o) : ZCLOBBER);
}

/* One 1x1 layer's loop nest on the zmm tile (see the header); GFLOP/s, *peak the FMA loop's. */
static double layer_zmm(long C, long H, long W, long O, int sw, int packed, int rounds,
                        double *peak)
{
    long oh = (H - 1) / sw + 1, ow = (W - 1) / sw + 1;
    long rows = 16384 / (ow * 128);
    if (rows < 1)
        rows = 1;
    if (rows > oh)
        rows = oh;
    long nblk = (O + 31) / 32, kc = 144;
    float *x = filled((size_t)C * (H * W + 64), 7), *w = filled((size_t)nblk * C * 32, 5);
    float *buf = filled((size_t)(rows * ow + 8) * 32, 3);
    long tiles = 0;   /* executed: each group's pixels in 8-pixel tiles, the last overlapping */
    for (long oy0 = 0; oy0 < oh; oy0 += rows)
        tiles += ((oh - oy0 < rows ? oh - oy0 : rows) * ow + 7) / 8;
    double flop = 2.0 * 8 * tiles * C * nblk * 32, best = 1e30;
    int reps = (int)(2e8 / flop) + 1;
    *peak = 0;
    for (int r = 0; r < rounds; r++) {
        double f = fma_peak512(1);
        if (f > *peak)
            *peak = f;
        double t = now();
        for (int rep = 0; rep < reps; rep++)
            for (long blk = 0; blk < nblk; blk++)
                for (long oy0 = 0; oy0 < oh; oy0 += rows) {
                    long n = (oh - oy0 < rows ? oh - oy0 : rows) * ow;
                    for (long c0 = 0; c0 < C; c0 += kc) {
                        long k = C - c0 < kc ? C - c0 : kc;
                        for (long p = 0; p < n; p += 8) {
                            long q = p < n - 8 ? p : n - 8;   /* the last tile overlaps */
                            long oy = oy0 + q / ow, ox = q % ow;
                            if (packed)   /* x as [tile][C][8] */
                                tile_8x32(k, x + (oy0 * ow + q) * C + c0 * 8, 32,
                                          w + (blk * C + c0) * 32, buf + q * 32, c0 > 0, 1);
                            else
                                tile_8x32(k, x + c0 * H * W + oy * sw * W + ox * sw, 4 * H * W,
                                          w + (blk * C + c0) * 32, buf + q * 32, c0 > 0, sw);
                        }
                    }
                }
        t = now() - t;
        if (t < best)
            best = t;
    }
    free(x);
    free(w);
    free(buf);
    return (double)reps * flop / best / 1e9;
}
#endif

int main(int argc, char **argv)
{
#ifdef __AVX512F__
    if (argc >= 7 && argv[1][0] == 'z') {
        long C = atol(argv[2]), H = atol(argv[3]), W = atol(argv[4]), O = atol(argv[5]);
        int sw = atoi(argv[6]), rounds = argc > 7 ? atoi(argv[7]) : 7;
        int packed = argv[1][1] == 'p';
        if (C < 1 || H < 1 || W < 1 || O < 1 || (sw != 1 && sw != 2) || rounds < 1 ||
            ((H - 1) / sw + 1) * ((W - 1) / sw + 1) < 8) {
            fprintf(stderr, "error: zmm C H W O SW [ROUNDS]: positive, SW 1 or 2, >= 8 "
                            "output pixels\n");
            return 2;
        }
        double peak, g = layer_zmm(C, H, W, O, sw, packed, rounds, &peak);
        printf("%s8 x 32 tile, 1x1 %ld -> %ld on %ldx%ld stride %d: FMA loop %.1f, tile "
               "%.1f GFLOP/s = %.1f %%\n", packed ? "zmm packed " : "zmm ", C, O, H, W, sw, peak, g, 100 * g / peak);
        return 0;
    }
#endif
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
