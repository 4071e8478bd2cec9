/* SHA-256 (FIPS 180-4): portable C, and the CPU's SHA-256 instructions where it has them (x86
 * SHA extensions, "sha_ni": Intel since Goldmont and Ice Lake, AMD since Zen, found by cpuid;
 * AArch64's SHA2 crypto extension, found in the auxiliary vector), about 5x faster: the content
 * digest of every open is most of an open's time. Each path tested against Python's hashlib. */
#include <string.h>

#include "internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MLC_SHA_NI 1
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define MLC_SHA_ARM 1
#include <arm_neon.h>
#include <sys/auxv.h>
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block_c(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16
               | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i]
                      + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

#ifdef MLC_SHA_NI
/* n 64-byte blocks with the SHA extensions: four rounds per step, the message schedule by
 * sha256msg1/sha256msg2 (Intel's "New Instructions Supporting the SHA-256" layout). */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_ni(uint32_t h[8],
                                                                   const uint8_t *p, size_t n)
{
    const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1); /* CDAB */
    __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B); /* EFGH */
    __m128i s0 = _mm_alignr_epi8(t, s1, 8);                                         /* ABEF */
    s1 = _mm_blend_epi16(s1, t, 0xF0);                                              /* CDGH */
    for (; n; n--, p += 64) {
        __m128i abef = s0, cdgh = s1, w[4];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            __m128i wi;
            if (i < 4)
                wi = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), swap);
            else /* w[i&3] holds W(i-4), then W(i-3), W(i-2), W(i-1) */
                wi = _mm_sha256msg2_epu32(
                    _mm_add_epi32(_mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]),
                                  _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4)),
                    w[(i + 3) & 3]);
            w[i & 3] = wi;
            __m128i m = _mm_add_epi32(wi, _mm_loadu_si128((const __m128i *)&K[4 * i]));
            s1 = _mm_sha256rnds2_epu32(s1, s0, m);
            s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E));
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    t = _mm_shuffle_epi32(s0, 0x1B);       /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);      /* DCHG */
    s0 = _mm_blend_epi16(t, s1, 0xF0);     /* DCBA */
    s1 = _mm_alignr_epi8(s1, t, 8);        /* HGFE */
    _mm_storeu_si128((__m128i *)&h[0], s0);
    _mm_storeu_si128((__m128i *)&h[4], s1);
}
#endif

#ifdef MLC_SHA_ARM
/* n 64-byte blocks with the SHA2 crypto extension: four rounds per sha256h/sha256h2 pair, the
 * message schedule by sha256su0/sha256su1. */
__attribute__((target("+crypto"))) static void blocks_arm(uint32_t h[8], const uint8_t *p,
                                                       size_t n)
{
    uint32x4_t s0 = vld1q_u32(&h[0]), s1 = vld1q_u32(&h[4]);
    for (; n; n--, p += 64) {
        uint32x4_t abcd = s0, efgh = s1, w[4];
        for (int i = 0; i < 4; i++)
            w[i] = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p + 16 * i)));
        for (int i = 0; i < 16; i++) {
            uint32x4_t wk = vaddq_u32(w[i & 3], vld1q_u32(&K[4 * i])), t = s0;
            if (i < 12) /* W(i+4) from W(i), W(i+1), W(i+2), W(i+3), into w[i&3] */
                w[i & 3] = vsha256su1q_u32(vsha256su0q_u32(w[i & 3], w[(i + 1) & 3]),
                                           w[(i + 2) & 3], w[(i + 3) & 3]);
            s0 = vsha256hq_u32(s0, s1, wk);
            s1 = vsha256h2q_u32(s1, t, wk);
        }
        s0 = vaddq_u32(s0, abcd);
        s1 = vaddq_u32(s1, efgh);
    }
    vst1q_u32(&h[0], s0);
    vst1q_u32(&h[4], s1);
}
#endif

int mlc_sha256_accelerated(void)
{
#ifdef MLC_SHA_NI
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid(1, a, b, c, d);
    int sse = (c >> 9 & 1) && (c >> 19 & 1);   /* ssse3, sse4.1 */
    __cpuid_count(7, 0, a, b, c, d);
    return sse && (b >> 29 & 1);
#elif defined(MLC_SHA_ARM)
    return getauxval(AT_HWCAP) >> 6 & 1;   /* HWCAP_SHA2 */
#else
    return 0;
#endif
}

static void blocks(mlc_sha256 *s, const uint8_t *p, size_t n)
{
#if defined(MLC_SHA_NI) || defined(MLC_SHA_ARM)
    if (s->accel) {
#ifdef MLC_SHA_NI
        blocks_ni(s->h, p, n);
#else
        blocks_arm(s->h, p, n);
#endif
        return;
    }
#endif
    for (; n; n--, p += 64)
        block_c(s->h, p);
}

void mlc_sha256_init(mlc_sha256 *s)
{
    mlc_sha256_start(s, mlc_sha256_accelerated());
}

void mlc_sha256_start(mlc_sha256 *s, int accel)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->bytes = 0;
    s->fill = 0;
    s->accel = accel;
}

void mlc_sha256_update(mlc_sha256 *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->bytes += n;
    if (s->fill) {
        size_t take = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->buf + s->fill, p, take);
        s->fill += take;
        p += take;
        n -= take;
        if (s->fill < 64)
            return;
        blocks(s, s->buf, 1);
        s->fill = 0;
    }
    blocks(s, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    memcpy(s->buf, p, n);
    s->fill = n;
}

void mlc_sha256_final(mlc_sha256 *s, uint8_t out[32])
{
    uint64_t bits = s->bytes * 8;
    uint8_t pad[72] = {0x80};
    size_t padlen = (s->fill < 56 ? 56 : 120) - s->fill;
    for (int i = 0; i < 8; i++)
        pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    mlc_sha256_update(s, pad, padlen + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void mlc_sha256_once(const void *data, size_t n, uint8_t out[32])
{
    mlc_sha256 s;
    mlc_sha256_init(&s);
    mlc_sha256_update(&s, data, n);
    mlc_sha256_final(&s, out);
}
