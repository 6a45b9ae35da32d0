/*
 * The 256-bit x86 paths, half a tile (8 output rows) per register:
 *   AVX2 (Haswell and later, AMD since Zen 1): `vpmaddubsw` (unsigned x signed byte pairs into a
 *   saturating int16) then `vpmaddwd` against ones (int16 pairs into int32);
 *   AVX-VNNI (Alder Lake and later without AVX-512): `vpdpbusd` on 256 bits, as the AVX-512 path.
 * Both quantize activations with the same AVX2 code. Same sums, same float operations in the same
 * order as the portable path (quant_dot.c).
 */
#include "quant_dot.h"

#if ARBOR_X86
#include <immintrin.h>

#define AVX2_TARGET "avx2,fma,f16c"
#define AVX2_INLINE __attribute__((target(AVX2_TARGET), always_inline)) static inline

/* ---------- activation quantization ---------- */

AVX2_INLINE float max8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

AVX2_INLINE int32_t sum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

/* 4 x 8 int32 (each within -127..127) -> 32 bytes in order: the packs interleave 128-bit lanes,
   the permute puts the dwords back */
AVX2_INLINE void store_bytes(int8_t *to, const __m256i *v) {
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((__m256i *)to, _mm256_permutevar8x32_epi32(packed, order));
}

__attribute__((target(AVX2_TARGET))) void arbor_quantize_block_avx2(const float *x, int8_t *q, int8_t *q2, float *d,
                                                                    int32_t *s) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
    const __m256 m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    const __m256 m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
    const float amax = max8(_mm256_max_ps(m01, m23));
    const float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    __m256i qi[4];
    /* cvtps rounds to nearest even under the default MXCSR, as nearbyintf does */
    for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    store_bytes(q, qi);
    int32_t sum = sum8(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
    if (q2) {
        const __m256 vid2 = _mm256_set1_ps(id * (float)RESIDUAL_STEPS), vd = _mm256_set1_ps(-dd);
        const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
        __m256i ri[4];
        for (int i = 0; i < 4; i++) {
            const __m256 residual = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qi[i]), vd, v[i]);
            ri[i] = _mm256_cvtps_epi32(_mm256_mul_ps(residual, vid2));
            ri[i] = _mm256_max_epi32(_mm256_min_epi32(ri[i], top), bottom);
        }
        store_bytes(q2, ri);
        sum = sum * RESIDUAL_STEPS + sum8(_mm256_add_epi32(_mm256_add_epi32(ri[0], ri[1]), _mm256_add_epi32(ri[2], ri[3])));
    }
    *d = q2 ? dd / (float)RESIDUAL_STEPS : dd;
    *s = sum;
}

/* ---------- AVX2 dot products ---------- */

/* A pair of weight (0..15) x activation (-127..127) products is at most 3,810: vpmaddubsw never
   saturates, and eight such pairs still fit an int16 (30,480), so one vpmaddwd per block, whose
   multiplier (1, or 254 for a two-term block's first term) costs nothing. */
AVX2_INLINE __m256i q4_pairs_avx2(const __m256i *lo, const __m256i *hi, const int8_t *a) {
    __m256i pairs = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32(load4(a + 4 * c))));
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32(load4(a + 16 + 4 * c))));
    }
    return pairs;
}

AVX2_INLINE __m256i q4_dot_avx2(const __m256i *lo, const __m256i *hi, const int8_t *a) {
    return _mm256_madd_epi16(q4_pairs_avx2(lo, hi, a), _mm256_set1_epi16(1));
}

AVX2_INLINE __m256i q4_dot_two_avx2(const __m256i *lo, const __m256i *hi, const int8_t *a, const int8_t *a2) {
    const __m256i first = _mm256_madd_epi16(q4_pairs_avx2(lo, hi, a), _mm256_set1_epi16(RESIDUAL_STEPS));
    return _mm256_add_epi32(first, q4_dot_avx2(lo, hi, a2));
}

/* int8 weights against int8 activations: the +128 offset of the VNNI paths would saturate
   vpmaddubsw (255 x 128 x 2), so the weight's sign moves onto the activation instead:
   |w| x sign(a, w) = w x a, pairs at most 2 x 128 x 127 = 32,512. The dot is then sum(w a)
   directly, which the other paths reach as the correction plus sum(w (a + 128)). vpmaddwd's
   multiplier scales a two-term block's first term by 254. */
AVX2_INLINE __m256i q8_chunk_avx2(__m256i w, __m256i abs_w, const int8_t *a, __m256i times) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(_mm256_set1_epi32(load4(a)), w)), times);
}

AVX2_INLINE void q8_dots_avx2(const uint8_t *rec, int half, const int8_t *a, const int8_t *a2, long stride, int nr,
                              __m256i *acc) {
    const __m256i ones = _mm256_set1_epi16(1), steps = _mm256_set1_epi16(RESIDUAL_STEPS);
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(rec + c * 64 + half * 32)), abs_w = _mm256_abs_epi8(w);
        for (int r = 0; r < nr; r++) {
            if (a2) {
                acc[r] = _mm256_add_epi32(acc[r], q8_chunk_avx2(w, abs_w, a + r * stride + 4 * c, steps));
                acc[r] = _mm256_add_epi32(acc[r], q8_chunk_avx2(w, abs_w, a2 + r * stride + 4 * c, ones));
            } else {
                acc[r] = _mm256_add_epi32(acc[r], q8_chunk_avx2(w, abs_w, a + r * stride + 4 * c, ones));
            }
        }
    }
}

#define YMM_NAME(x) x##_avx2
#define YMM_TARGET AVX2_TARGET
#include "quant_dot_ymm.h"
#undef YMM_NAME
#undef YMM_TARGET

const arbor_path arbor_path_avx2 = {arbor_quantize_block_avx2, q4_tile_avx2, q8_tile_avx2};

/* ---------- AVX-VNNI dot products ---------- */

#if ARBOR_HAVE_AVX_VNNI
#if defined(ARBOR_AVX_VNNI_VIA_EVEX)
#define AVX_VNNI_TARGET "avx512vl,avx512vnni,avx2,fma,f16c"
#define DPBUSD256 _mm256_dpbusd_epi32
#else
#define AVX_VNNI_TARGET "avxvnni,avx2,fma,f16c"
#define DPBUSD256 _mm256_dpbusd_avx_epi32
#endif
#define AVX_VNNI_INLINE __attribute__((target(AVX_VNNI_TARGET), always_inline)) static inline

AVX_VNNI_INLINE __m256i q4_dot_avx_vnni(const __m256i *lo, const __m256i *hi, const int8_t *a) {
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        acc0 = DPBUSD256(acc0, lo[c], _mm256_set1_epi32(load4(a + 4 * c)));
        acc1 = DPBUSD256(acc1, hi[c], _mm256_set1_epi32(load4(a + 16 + 4 * c)));
    }
    return _mm256_add_epi32(acc0, acc1);
}

AVX_VNNI_INLINE __m256i q4_dot_two_avx_vnni(const __m256i *lo, const __m256i *hi, const int8_t *a, const int8_t *a2) {
    const __m256i first = _mm256_mullo_epi32(q4_dot_avx_vnni(lo, hi, a), _mm256_set1_epi32(RESIDUAL_STEPS));
    return _mm256_add_epi32(first, q4_dot_avx_vnni(lo, hi, a2));
}

/* the activation goes in as q_a + 128 (an unsigned byte); the record's correction takes the 128s out */
AVX_VNNI_INLINE void q8_dots_avx_vnni(const uint8_t *rec, int half, const int8_t *a, const int8_t *a2, long stride,
                                      int nr, __m256i *acc) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), correction = _mm256_loadu_si256((const __m256i *)(rec + 544 + half * 32));
    __m256i acc2[MAX_ROW_BLOCK];
    for (int r = 0; r < nr; r++) acc[r] = acc2[r] = correction;
    for (int c = 0; c < 8; c++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(rec + c * 64 + half * 32));
        for (int r = 0; r < nr; r++) {
            acc[r] = DPBUSD256(acc[r], _mm256_xor_si256(_mm256_set1_epi32(load4(a + r * stride + 4 * c)), flip), w);
            if (a2) acc2[r] = DPBUSD256(acc2[r], _mm256_xor_si256(_mm256_set1_epi32(load4(a2 + r * stride + 4 * c)), flip), w);
        }
    }
    if (a2) {
        for (int r = 0; r < nr; r++) acc[r] = _mm256_add_epi32(_mm256_mullo_epi32(acc[r], _mm256_set1_epi32(RESIDUAL_STEPS)), acc2[r]);
    }
}

#define YMM_NAME(x) x##_avx_vnni
#define YMM_TARGET AVX_VNNI_TARGET
#include "quant_dot_ymm.h"
#undef YMM_NAME
#undef YMM_TARGET

const arbor_path arbor_path_avx_vnni = {arbor_quantize_block_avx2, q4_tile_avx_vnni, q8_tile_avx_vnni};
#endif
#endif
