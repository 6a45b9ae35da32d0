/*
 * The AVX-512 VNNI path (`vpdpbusd`: unsigned x signed bytes into int32; Intel since Cascade Lake,
 * AMD since Zen 4): a tile's 16 output rows in one 512-bit register. Same sums, same float
 * operations in the same order as the portable path (quant_dot.c).
 */
#include "quant_dot.h"

#if ARBOR_X86
#include <immintrin.h>

__attribute__((target("avx512f,avx512bw")))
static void quantize_block_avx512(const float *x, int8_t *q, int8_t *q2, float *d, int32_t *s) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const __m512 m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
    const float amax = _mm512_reduce_max_ps(m);
    const float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    /* cvtps rounds to nearest even under the default MXCSR, as nearbyintf does */
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(qb));
    int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    if (q2) {
        const __m512 vid2 = _mm512_set1_ps(id * (float)RESIDUAL_STEPS), vd = _mm512_set1_ps(-dd);
        const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
        __m512i ra = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(qa), vd, a), vid2));
        __m512i rb = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(qb), vd, b), vid2));
        ra = _mm512_max_epi32(_mm512_min_epi32(ra, top), bottom);
        rb = _mm512_max_epi32(_mm512_min_epi32(rb, top), bottom);
        _mm_storeu_si128((__m128i *)q2, _mm512_cvtsepi32_epi8(ra));
        _mm_storeu_si128((__m128i *)(q2 + 16), _mm512_cvtsepi32_epi8(rb));
        sum = sum * RESIDUAL_STEPS + _mm512_reduce_add_epi32(_mm512_add_epi32(ra, rb));
    }
    *d = q2 ? dd / (float)RESIDUAL_STEPS : dd;
    *s = sum;
}

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c"), always_inline)) static inline

VNNI __m512i q4_dot_vnni(const __m512i *lo, const __m512i *hi, const int8_t *a) {
    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
    acc0 = _mm512_dpbusd_epi32(acc0, lo[0], _mm512_set1_epi32(load4(a + 0)));
    acc1 = _mm512_dpbusd_epi32(acc1, hi[0], _mm512_set1_epi32(load4(a + 16)));
    acc0 = _mm512_dpbusd_epi32(acc0, lo[1], _mm512_set1_epi32(load4(a + 4)));
    acc1 = _mm512_dpbusd_epi32(acc1, hi[1], _mm512_set1_epi32(load4(a + 20)));
    acc0 = _mm512_dpbusd_epi32(acc0, lo[2], _mm512_set1_epi32(load4(a + 8)));
    acc1 = _mm512_dpbusd_epi32(acc1, hi[2], _mm512_set1_epi32(load4(a + 24)));
    acc0 = _mm512_dpbusd_epi32(acc0, lo[3], _mm512_set1_epi32(load4(a + 12)));
    acc1 = _mm512_dpbusd_epi32(acc1, hi[3], _mm512_set1_epi32(load4(a + 28)));
    return _mm512_add_epi32(acc0, acc1);
}

VNNI __m512i q8_dot_vnni(const uint8_t *rec, __m512i correction, const int8_t *a) {
    const __m512i flip = _mm512_set1_epi8((char)0x80); /* q_a + 128 as an unsigned byte */
    __m512i acc0 = correction, acc1 = _mm512_setzero_si512();
    for (int c = 0; c < 8; c += 2) {
        const __m512i w0 = _mm512_loadu_si512((const void *)(rec + c * 64));
        const __m512i w1 = _mm512_loadu_si512((const void *)(rec + (c + 1) * 64));
        acc0 = _mm512_dpbusd_epi32(acc0, _mm512_xor_si512(_mm512_set1_epi32(load4(a + 4 * c)), flip), w0);
        acc1 = _mm512_dpbusd_epi32(acc1, _mm512_xor_si512(_mm512_set1_epi32(load4(a + 4 * c + 4)), flip), w1);
    }
    return _mm512_add_epi32(acc0, acc1);
}

VNNI void q4_tile_rows_vnni(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                            const int32_t *sa, int t0, const int nr, int k, float *out, int n, int n0) {
    const __m512i low = _mm512_set1_epi8(0x0f), steps = _mm512_set1_epi32(RESIDUAL_STEPS);
    __m512 sum[MAX_ROW_BLOCK];
    for (int r = 0; r < nr; r++) sum[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = tile + (long)g * Q4_RECORD;
        for (int line = 0; line < Q4_RECORD; line += 64) _mm_prefetch((const char *)(rec + PREFETCH_BYTES + line), _MM_HINT_T0);
        __m512i lo[4], hi[4];
        for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_loadu_si512((const void *)(rec + c * 64));
            lo[c] = _mm512_and_si512(v, low);
            hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 256)));
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 288)));
        for (int r = 0; r < nr; r++) {
            const long at = (long)(t0 + r) * k + (long)g * QK;
            __m512i acc = q4_dot_vnni(lo, hi, qa + at);
            if (qa2) acc = _mm512_add_epi32(_mm512_mullo_epi32(acc, steps), q4_dot_vnni(lo, hi, qa2 + at));
            const long ag = (long)(t0 + r) * groups + g;
            const float dat = da[ag], mterm = dat * (float)sa[ag];
            const __m512 dot = _mm512_cvtepi32_ps(acc);
            sum[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_set1_ps(dat)), sum[r]);
            sum[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(mterm), sum[r]);
        }
    }
    const __mmask16 keep = n - n0 >= TILE ? (__mmask16)0xffff : (__mmask16)((1u << (n - n0)) - 1);
    for (int r = 0; r < nr; r++) _mm512_mask_storeu_ps(out + (long)(t0 + r) * n + n0, keep, sum[r]);
}

VNNI void q8_tile_rows_vnni(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                            int t0, const int nr, int k, float *out, int n, int n0) {
    const __m512i steps = _mm512_set1_epi32(RESIDUAL_STEPS);
    __m512 sum[MAX_ROW_BLOCK];
    for (int r = 0; r < nr; r++) sum[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = tile + (long)g * Q8_RECORD;
        for (int line = 0; line < Q8_RECORD; line += 64) _mm_prefetch((const char *)(rec + PREFETCH_BYTES + line), _MM_HINT_T0);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 512)));
        const __m512i cw = _mm512_loadu_si512((const void *)(rec + 544));
        for (int r = 0; r < nr; r++) {
            const long at = (long)(t0 + r) * k + (long)g * QK;
            __m512i acc = q8_dot_vnni(rec, cw, qa + at);
            if (qa2) acc = _mm512_add_epi32(_mm512_mullo_epi32(acc, steps), q8_dot_vnni(rec, cw, qa2 + at));
            const float dat = da[(long)(t0 + r) * groups + g];
            const __m512 dot = _mm512_cvtepi32_ps(acc);
            sum[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_set1_ps(dat)), sum[r]);
        }
    }
    const __mmask16 keep = n - n0 >= TILE ? (__mmask16)0xffff : (__mmask16)((1u << (n - n0)) - 1);
    for (int r = 0; r < nr; r++) _mm512_mask_storeu_ps(out + (long)(t0 + r) * n + n0, keep, sum[r]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
static void q4_tile_vnni(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                         const int32_t *sa, int rows, int k, float *out, int n, int n0) {
    int t = 0;
    for (; t + 4 <= rows; t += 4) q4_tile_rows_vnni(tile, groups, qa, qa2, da, sa, t, 4, k, out, n, n0);
    switch (rows - t) {
        case 3: q4_tile_rows_vnni(tile, groups, qa, qa2, da, sa, t, 3, k, out, n, n0); break;
        case 2: q4_tile_rows_vnni(tile, groups, qa, qa2, da, sa, t, 2, k, out, n, n0); break;
        case 1: q4_tile_rows_vnni(tile, groups, qa, qa2, da, sa, t, 1, k, out, n, n0); break;
        default: break;
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
static void q8_tile_vnni(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                         int rows, int k, float *out, int n, int n0) {
    int t = 0;
    for (; t + 4 <= rows; t += 4) q8_tile_rows_vnni(tile, groups, qa, qa2, da, t, 4, k, out, n, n0);
    switch (rows - t) {
        case 3: q8_tile_rows_vnni(tile, groups, qa, qa2, da, t, 3, k, out, n, n0); break;
        case 2: q8_tile_rows_vnni(tile, groups, qa, qa2, da, t, 2, k, out, n, n0); break;
        case 1: q8_tile_rows_vnni(tile, groups, qa, qa2, da, t, 1, k, out, n, n0); break;
        default: break;
    }
}

const arbor_path arbor_path_avx512_vnni = {quantize_block_avx512, q4_tile_vnni, q8_tile_vnni};
#endif
