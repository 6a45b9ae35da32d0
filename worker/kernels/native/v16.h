/*
 * A vector of 16 floats and the few operations the fused layers need, on four ISAs: AVX-512 (one
 * __m512), AVX2 + FMA (two __m256), NEON (four float32x4_t) and portable C (float[16], fmaf).
 *
 * Every operation is the same IEEE float operation, lane by lane, on every ISA, so code written
 * over these gives bitwise the same results on each: fmadd is one fused multiply-add (one rounding),
 * min/max follow x86's rule (the second operand when the first is not strictly less/greater, NaN
 * included), round is to nearest even, scale2 multiplies by 2^n built exactly, and sum adds the
 * lanes in one tree:
 *
 *     s8[i] = v[i] + v[i + 8] (i < 8);  s4[i] = s8[i] + s8[i + 4];  s2[i] = s4[i] + s4[i + 2];  s2[0] + s2[1]
 *
 * (GCC's _mm512_reduce_add_ps order); scaled_sums gives n vectors' sums, each times a scale, in that
 * same tree (AVX-512 sixteen and AVX2 eight at once, by shuffles). Tails shorter than 16 load zeros
 * into the missing lanes.
 * Names: <isa>_<op>, types v16_<isa>.
 */
#ifndef ARBOR_V16_H
#define ARBOR_V16_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define V16_INLINE static inline __attribute__((always_inline))

/* ---------- portable C ---------- */

typedef struct {
    float f[16];
} v16_portable;

#define PORTABLE_LANES(expr)              \
    v16_portable out;                     \
    for (int i = 0; i < 16; i++) out.f[i] = (expr); \
    return out

V16_INLINE v16_portable portable_zero(void) { PORTABLE_LANES(0.0f); }
V16_INLINE v16_portable portable_set1(float x) { PORTABLE_LANES(x); }
V16_INLINE v16_portable portable_load(const float *p) { PORTABLE_LANES(p[i]); }
V16_INLINE v16_portable portable_load_n(const float *p, int n) { PORTABLE_LANES(i < n ? p[i] : 0.0f); }
V16_INLINE void portable_store(float *p, v16_portable v) { memcpy(p, v.f, sizeof v.f); }
V16_INLINE void portable_store_n(float *p, v16_portable v, int n) { memcpy(p, v.f, sizeof(float) * (size_t)n); }
V16_INLINE v16_portable portable_add(v16_portable a, v16_portable b) { PORTABLE_LANES(a.f[i] + b.f[i]); }
V16_INLINE v16_portable portable_sub(v16_portable a, v16_portable b) { PORTABLE_LANES(a.f[i] - b.f[i]); }
V16_INLINE v16_portable portable_mul(v16_portable a, v16_portable b) { PORTABLE_LANES(a.f[i] * b.f[i]); }
V16_INLINE v16_portable portable_div(v16_portable a, v16_portable b) { PORTABLE_LANES(a.f[i] / b.f[i]); }
V16_INLINE v16_portable portable_min(v16_portable a, v16_portable b) { PORTABLE_LANES(a.f[i] < b.f[i] ? a.f[i] : b.f[i]); }
V16_INLINE v16_portable portable_max(v16_portable a, v16_portable b) { PORTABLE_LANES(a.f[i] > b.f[i] ? a.f[i] : b.f[i]); }
V16_INLINE v16_portable portable_round(v16_portable a) { PORTABLE_LANES(nearbyintf(a.f[i])); }

/* a * b + c, one rounding */
V16_INLINE v16_portable portable_fmadd(v16_portable a, v16_portable b, v16_portable c) {
    PORTABLE_LANES(fmaf(a.f[i], b.f[i], c.f[i]));
}

/* c - a * b, one rounding */
V16_INLINE v16_portable portable_fnmadd(v16_portable a, v16_portable b, v16_portable c) {
    PORTABLE_LANES(fmaf(-a.f[i], b.f[i], c.f[i]));
}

/* 2^n for an integral n in [-126, 127], exactly */
V16_INLINE float pow2_exact(float n) {
    const int32_t bits = ((int32_t)n + 127) << 23;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* p * 2^n, n integral in [-126, 127] */
V16_INLINE v16_portable portable_scale2(v16_portable p, v16_portable n) { PORTABLE_LANES(p.f[i] * pow2_exact(n.f[i])); }

V16_INLINE float portable_sum(v16_portable v) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = v.f[i] + v.f[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* out[i] = sum(v[i]) * scale for i < n */
V16_INLINE void portable_scaled_sums(const v16_portable *v, int n, float scale, float *out) {
    for (int i = 0; i < n; i++) out[i] = portable_sum(v[i]) * scale;
}

#undef PORTABLE_LANES

/* ---------- x86: AVX-512 and AVX2 + FMA ---------- */

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512_OP static inline __attribute__((always_inline, target("avx512f")))
#define AVX2_OP static inline __attribute__((always_inline, target("avx2,fma")))

/* the tree from s8 on, shared by both x86 paths */
static inline __attribute__((always_inline, target("avx"))) float sum8_tree(__m256 s8) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

typedef __m512 v16_avx512;

AVX512_OP __m512 avx512_zero(void) { return _mm512_setzero_ps(); }
AVX512_OP __m512 avx512_set1(float x) { return _mm512_set1_ps(x); }
AVX512_OP __m512 avx512_load(const float *p) { return _mm512_loadu_ps(p); }
AVX512_OP __m512 avx512_load_n(const float *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
AVX512_OP void avx512_store(float *p, __m512 v) { _mm512_storeu_ps(p, v); }
AVX512_OP void avx512_store_n(float *p, __m512 v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v); }
AVX512_OP __m512 avx512_add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
AVX512_OP __m512 avx512_sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
AVX512_OP __m512 avx512_mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
AVX512_OP __m512 avx512_div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
AVX512_OP __m512 avx512_min(__m512 a, __m512 b) { return _mm512_min_ps(a, b); }
AVX512_OP __m512 avx512_max(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
AVX512_OP __m512 avx512_round(__m512 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT); }
AVX512_OP __m512 avx512_fmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
AVX512_OP __m512 avx512_fnmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fnmadd_ps(a, b, c); }
/* scalef rounds p * 2^n once, as the multiply by an exact 2^n does */
AVX512_OP __m512 avx512_scale2(__m512 p, __m512 n) { return _mm512_scalef_ps(p, n); }

AVX512_OP float avx512_sum(__m512 v) {
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return sum8_tree(_mm256_add_ps(_mm512_castps512_ps256(v), high));
}

/* v16.h's tree for sixteen vectors at once, every level one add of two shuffles: s8 of keys 2k, 2k+1
   side by side, then s4 of four keys, then s2 of keys L and 4 + L (L the 128-bit lane), then the
   sums of keys L, 4 + L, 8 + L, 12 + L in lane L, put in key order by one permute */
AVX512_OP __m512 avx512_sum16(const __m512 *v) {
    __m512 s8[8], s4[4], s2[2];
    for (int k = 0; k < 8; k++)
        s8[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int m = 0; m < 4; m++)
        s4[m] = _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * m], s8[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(s8[2 * m], s8[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int n = 0; n < 2; n++)
        s2[n] = _mm512_add_ps(_mm512_shuffle_ps(s4[2 * n], s4[2 * n + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(s4[2 * n], s4[2 * n + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* lane 4L + s holds key 4s + L */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, sums);
}

AVX512_OP void avx512_scaled_sums(const __m512 *v, int n, float scale, float *out) {
    if (n == 16) {
        _mm512_storeu_ps(out, _mm512_mul_ps(avx512_sum16(v), _mm512_set1_ps(scale)));
        return;
    }
    for (int i = 0; i < n; i++) out[i] = avx512_sum(v[i]) * scale;
}

typedef struct {
    __m256 lo, hi; /* lanes 0-7, 8-15 */
} v16_avx2;

#define AVX2_LANES(op, a, b) (v16_avx2){op((a).lo, (b).lo), op((a).hi, (b).hi)}

AVX2_OP v16_avx2 avx2_zero(void) { return (v16_avx2){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
AVX2_OP v16_avx2 avx2_set1(float x) { return (v16_avx2){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
AVX2_OP v16_avx2 avx2_load(const float *p) { return (v16_avx2){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
AVX2_OP void avx2_store(float *p, v16_avx2 v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
AVX2_OP v16_avx2 avx2_load_n(const float *p, int n) {
    float padded[16] = {0};
    memcpy(padded, p, sizeof(float) * (size_t)n);
    return avx2_load(padded);
}
AVX2_OP void avx2_store_n(float *p, v16_avx2 v, int n) {
    float padded[16];
    avx2_store(padded, v);
    memcpy(p, padded, sizeof(float) * (size_t)n);
}
AVX2_OP v16_avx2 avx2_add(v16_avx2 a, v16_avx2 b) { return AVX2_LANES(_mm256_add_ps, a, b); }
AVX2_OP v16_avx2 avx2_sub(v16_avx2 a, v16_avx2 b) { return AVX2_LANES(_mm256_sub_ps, a, b); }
AVX2_OP v16_avx2 avx2_mul(v16_avx2 a, v16_avx2 b) { return AVX2_LANES(_mm256_mul_ps, a, b); }
AVX2_OP v16_avx2 avx2_div(v16_avx2 a, v16_avx2 b) { return AVX2_LANES(_mm256_div_ps, a, b); }
AVX2_OP v16_avx2 avx2_min(v16_avx2 a, v16_avx2 b) { return AVX2_LANES(_mm256_min_ps, a, b); }
AVX2_OP v16_avx2 avx2_max(v16_avx2 a, v16_avx2 b) { return AVX2_LANES(_mm256_max_ps, a, b); }
AVX2_OP v16_avx2 avx2_round(v16_avx2 a) {
    /* the mode a literal: clang needs a constant expression here, not a const variable */
    return (v16_avx2){_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                      _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
AVX2_OP v16_avx2 avx2_fmadd(v16_avx2 a, v16_avx2 b, v16_avx2 c) {
    return (v16_avx2){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
AVX2_OP v16_avx2 avx2_fnmadd(v16_avx2 a, v16_avx2 b, v16_avx2 c) {
    return (v16_avx2){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
AVX2_OP __m256 avx2_pow2(__m256 n) {
    const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));
}
AVX2_OP v16_avx2 avx2_scale2(v16_avx2 p, v16_avx2 n) {
    return (v16_avx2){_mm256_mul_ps(p.lo, avx2_pow2(n.lo)), _mm256_mul_ps(p.hi, avx2_pow2(n.hi))};
}
AVX2_OP float avx2_sum(v16_avx2 v) { return sum8_tree(_mm256_add_ps(v.lo, v.hi)); }

/* eight keys' s8 vectors -> their sums in key order: s4 of keys 2k, 2k + 1 side by side, then s2 of
   keys (a, c | b, d), then the sums as (0, 2, 4, 6 | 1, 3, 5, 7), put in order by one permute */
AVX2_OP __m256 avx2_sum8x8(const __m256 *s8) {
    __m256 s4[4], s2[2];
    for (int k = 0; k < 4; k++)
        s4[k] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * k], s8[2 * k + 1], 0x20),
                              _mm256_permute2f128_ps(s8[2 * k], s8[2 * k + 1], 0x31));
    for (int m = 0; m < 2; m++)
        s2[m] = _mm256_add_ps(_mm256_shuffle_ps(s4[2 * m], s4[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(s4[2 * m], s4[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm256_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(sums, _mm256_set_epi32(7, 3, 6, 2, 5, 1, 4, 0));
}

AVX2_OP void avx2_scaled_sums(const v16_avx2 *v, int n, float scale, float *out) {
    if (n == 8) {
        __m256 s8[8];
        for (int i = 0; i < 8; i++) s8[i] = _mm256_add_ps(v[i].lo, v[i].hi);
        _mm256_storeu_ps(out, _mm256_mul_ps(avx2_sum8x8(s8), _mm256_set1_ps(scale)));
        return;
    }
    for (int i = 0; i < n; i++) out[i] = avx2_sum(v[i]) * scale;
}

#undef AVX2_LANES
#endif

/* ---------- aarch64: NEON (baseline on every AArch64 core) ---------- */

#if defined(__aarch64__)
#include <arm_neon.h>

typedef struct {
    float32x4_t q[4]; /* lanes 0-3, 4-7, 8-11, 12-15 */
} v16_neon;

#define NEON_LANES(expr)                          \
    v16_neon out;                                 \
    for (int j = 0; j < 4; j++) out.q[j] = (expr); \
    return out

V16_INLINE v16_neon neon_zero(void) { NEON_LANES(vdupq_n_f32(0.0f)); }
V16_INLINE v16_neon neon_set1(float x) { NEON_LANES(vdupq_n_f32(x)); }
V16_INLINE v16_neon neon_load(const float *p) { NEON_LANES(vld1q_f32(p + 4 * j)); }
V16_INLINE void neon_store(float *p, v16_neon v) {
    for (int j = 0; j < 4; j++) vst1q_f32(p + 4 * j, v.q[j]);
}
V16_INLINE v16_neon neon_load_n(const float *p, int n) {
    float padded[16] = {0};
    memcpy(padded, p, sizeof(float) * (size_t)n);
    return neon_load(padded);
}
V16_INLINE void neon_store_n(float *p, v16_neon v, int n) {
    float padded[16];
    neon_store(padded, v);
    memcpy(p, padded, sizeof(float) * (size_t)n);
}
V16_INLINE v16_neon neon_add(v16_neon a, v16_neon b) { NEON_LANES(vaddq_f32(a.q[j], b.q[j])); }
V16_INLINE v16_neon neon_sub(v16_neon a, v16_neon b) { NEON_LANES(vsubq_f32(a.q[j], b.q[j])); }
V16_INLINE v16_neon neon_mul(v16_neon a, v16_neon b) { NEON_LANES(vmulq_f32(a.q[j], b.q[j])); }
V16_INLINE v16_neon neon_div(v16_neon a, v16_neon b) { NEON_LANES(vdivq_f32(a.q[j], b.q[j])); }
/* vminq/vmaxq return NaN for a NaN operand; a select keeps x86's rule */
V16_INLINE v16_neon neon_min(v16_neon a, v16_neon b) { NEON_LANES(vbslq_f32(vcltq_f32(a.q[j], b.q[j]), a.q[j], b.q[j])); }
V16_INLINE v16_neon neon_max(v16_neon a, v16_neon b) { NEON_LANES(vbslq_f32(vcgtq_f32(a.q[j], b.q[j]), a.q[j], b.q[j])); }
V16_INLINE v16_neon neon_round(v16_neon a) { NEON_LANES(vrndnq_f32(a.q[j])); }
V16_INLINE v16_neon neon_fmadd(v16_neon a, v16_neon b, v16_neon c) { NEON_LANES(vfmaq_f32(c.q[j], a.q[j], b.q[j])); }
V16_INLINE v16_neon neon_fnmadd(v16_neon a, v16_neon b, v16_neon c) { NEON_LANES(vfmsq_f32(c.q[j], a.q[j], b.q[j])); }
V16_INLINE float32x4_t neon_pow2(float32x4_t n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}
V16_INLINE v16_neon neon_scale2(v16_neon p, v16_neon n) { NEON_LANES(vmulq_f32(p.q[j], neon_pow2(n.q[j]))); }

V16_INLINE float neon_sum(v16_neon v) {
    const float32x4_t s4 = vaddq_f32(vaddq_f32(v.q[0], v.q[2]), vaddq_f32(v.q[1], v.q[3]));
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}

V16_INLINE void neon_scaled_sums(const v16_neon *v, int n, float scale, float *out) {
    for (int i = 0; i < n; i++) out[i] = neon_sum(v[i]) * scale;
}

#undef NEON_LANES
#endif

#endif
