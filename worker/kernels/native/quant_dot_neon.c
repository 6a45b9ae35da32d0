/*
 * The ARM path (aarch64 with the dot product extension: Graviton 2 and later, Ampere Altra, Apple
 * M1 and later): `sdot` (vdotq_s32) multiplies signed bytes in groups of 4 into int32, so a 16-byte
 * quarter of a record's 64-byte chunk (4 output rows x 4 bytes) gives 4 rows' partial dots. Same
 * sums, same float operations in the same order as the portable path (quant_dot.c). The functions
 * carry their own target, so the library builds for any aarch64 and runs this path only where
 * the CPU has it (quant_dot.c checks HWCAP_ASIMDDP).
 */
#include "quant_dot.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#if defined(__clang__)
#define NEON_TARGET "dotprod"
#else
#define NEON_TARGET "arch=armv8.2-a+dotprod"
#endif
#define NEON_FN __attribute__((target(NEON_TARGET)))
#define NEON_INLINE __attribute__((target(NEON_TARGET), always_inline)) static inline

/* ---------- activation quantization ---------- */

/* 8 x 4 int32 (each within -127..127) -> 32 bytes */
NEON_INLINE void store_bytes(int8_t *to, const int32x4_t *v) {
    for (int i = 0; i < 8; i += 4) {
        const int16x8_t h0 = vcombine_s16(vqmovn_s32(v[i]), vqmovn_s32(v[i + 1]));
        const int16x8_t h1 = vcombine_s16(vqmovn_s32(v[i + 2]), vqmovn_s32(v[i + 3]));
        vst1q_s8(to + 4 * i, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
    }
}

NEON_INLINE int32_t sum32(const int32x4_t *v) {
    int32x4_t total = v[0];
    for (int i = 1; i < 8; i++) total = vaddq_s32(total, v[i]);
    return vaddvq_s32(total);
}

NEON_FN static void quantize_block_neon(const float *x, int8_t *q, int8_t *q2, float *d, int32_t *s) {
    float32x4_t v[8];
    for (int i = 0; i < 8; i++) v[i] = vld1q_f32(x + 4 * i);
    float32x4_t m = vabsq_f32(v[0]);
    for (int i = 1; i < 8; i++) m = vmaxq_f32(m, vabsq_f32(v[i]));
    const float amax = vmaxvq_f32(m);
    const float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32x4_t qi[8];
    /* fcvtns rounds to nearest even, as nearbyintf does under the default rounding mode */
    for (int i = 0; i < 8; i++) qi[i] = vcvtnq_s32_f32(vmulq_n_f32(v[i], id));
    store_bytes(q, qi);
    int32_t sum = sum32(qi);
    if (q2) {
        const float id2 = id * (float)RESIDUAL_STEPS;
        const float32x4_t vd = vdupq_n_f32(-dd);
        const int32x4_t top = vdupq_n_s32(127), bottom = vdupq_n_s32(-127);
        int32x4_t ri[8];
        for (int i = 0; i < 8; i++) {
            const float32x4_t residual = vfmaq_f32(v[i], vcvtq_f32_s32(qi[i]), vd);
            ri[i] = vmaxq_s32(vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(residual, id2)), top), bottom);
        }
        store_bytes(q2, ri);
        sum = sum * RESIDUAL_STEPS + sum32(ri);
    }
    *d = q2 ? dd / (float)RESIDUAL_STEPS : dd;
    *s = sum;
}

/* ---------- tiles ---------- */

NEON_INLINE float32x4_t halves(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p))); }

NEON_INLINE int8x16_t splat4(const int8_t *a) { return vreinterpretq_s8_s32(vdupq_n_s32(load4(a))); }

/* clang before 16 declares vdotq_s32 only when the whole file is built for dotprod (-march), which
   would let the compiler use it anywhere: there the instruction is written out instead */
NEON_INLINE int32x4_t sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__clang__) && __clang_major__ < 16 && !defined(__ARM_FEATURE_DOTPROD)
    __asm__(".arch armv8.2-a+dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#else
    return vdotq_s32(acc, a, b);
#endif
}

/* quarter j's 4 rows: the exact int32 dot with one block of activations */
NEON_INLINE int32x4_t q4_dot_neon(const int8x16_t lo[4][4], const int8x16_t hi[4][4], int j, const int8_t *a) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int c = 0; c < 4; c++) {
        acc = sdot(acc, lo[c][j], splat4(a + 4 * c));
        acc = sdot(acc, hi[c][j], splat4(a + 16 + 4 * c));
    }
    return acc;
}

/* signed x signed: the dot is sum(w a) directly, which the x86 VNNI paths reach as the correction
   plus sum(w (a + 128)) */
NEON_INLINE int32x4_t q8_dot_neon(const uint8_t *rec, int j, const int8_t *a) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int c = 0; c < 8; c++) acc = sdot(acc, vld1q_s8((const int8_t *)(rec + c * 64 + 16 * j)), splat4(a + 4 * c));
    return acc;
}

NEON_INLINE void store_tile(float32x4_t sum[][4], int t0, int nr, float *out, int n, int n0) {
    for (int r = 0; r < nr; r++) {
        for (int j = 0; j < 4 && n0 + 4 * j < n; j++) {
            float *to = out + (long)(t0 + r) * n + n0 + 4 * j;
            float all[4];
            vst1q_f32(all, sum[r][j]);
            memcpy(to, all, sizeof(float) * (size_t)(n - n0 - 4 * j >= 4 ? 4 : n - n0 - 4 * j));
        }
    }
}

NEON_INLINE void q4_tile_rows_neon(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2,
                                   const float *da, const int32_t *sa, int t0, const int nr, int k, float *out, int n,
                                   int n0) {
    const uint8x16_t low = vdupq_n_u8(0x0f);
    float32x4_t sum[MAX_ROW_BLOCK][4];
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < 4; j++) sum[r][j] = vdupq_n_f32(0.0f);
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = tile + (long)g * Q4_RECORD;
        for (int line = 0; line < Q4_RECORD; line += 64) __builtin_prefetch(rec + PREFETCH_BYTES + line);
        int8x16_t lo[4][4], hi[4][4];
        for (int c = 0; c < 4; c++) {
            for (int j = 0; j < 4; j++) {
                const uint8x16_t v = vld1q_u8(rec + c * 64 + 16 * j);
                lo[c][j] = vreinterpretq_s8_u8(vandq_u8(v, low));
                hi[c][j] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            }
        }
        for (int r = 0; r < nr; r++) {
            const long at = (long)(t0 + r) * k + (long)g * QK, ag = (long)(t0 + r) * groups + g;
            const float dat = da[ag], mterm = dat * (float)sa[ag];
            for (int j = 0; j < 4; j++) {
                int32x4_t acc = q4_dot_neon(lo, hi, j, qa + at);
                if (qa2) acc = vmlaq_n_s32(q4_dot_neon(lo, hi, j, qa2 + at), acc, RESIDUAL_STEPS);
                const float32x4_t scale = vmulq_n_f32(halves(rec + 256 + 8 * j), dat);
                sum[r][j] = vfmaq_f32(sum[r][j], vcvtq_f32_s32(acc), scale);
                sum[r][j] = vfmaq_f32(sum[r][j], halves(rec + 288 + 8 * j), vdupq_n_f32(mterm));
            }
        }
    }
    store_tile(sum, t0, nr, out, n, n0);
}

NEON_INLINE void q8_tile_rows_neon(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2,
                                   const float *da, int t0, const int nr, int k, float *out, int n, int n0) {
    float32x4_t sum[MAX_ROW_BLOCK][4];
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < 4; j++) sum[r][j] = vdupq_n_f32(0.0f);
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = tile + (long)g * Q8_RECORD;
        for (int line = 0; line < Q8_RECORD; line += 64) __builtin_prefetch(rec + PREFETCH_BYTES + line);
        for (int r = 0; r < nr; r++) {
            const long at = (long)(t0 + r) * k + (long)g * QK;
            const float dat = da[(long)(t0 + r) * groups + g];
            for (int j = 0; j < 4; j++) {
                int32x4_t acc = q8_dot_neon(rec, j, qa + at);
                if (qa2) acc = vmlaq_n_s32(q8_dot_neon(rec, j, qa2 + at), acc, RESIDUAL_STEPS);
                sum[r][j] = vfmaq_f32(sum[r][j], vcvtq_f32_s32(acc), vmulq_n_f32(halves(rec + 512 + 8 * j), dat));
            }
        }
    }
    store_tile(sum, t0, nr, out, n, n0);
}

NEON_FN static void q4_tile_neon(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                                 const int32_t *sa, int rows, int k, float *out, int n, int n0) {
    int t = 0;
    for (; t + 4 <= rows; t += 4) q4_tile_rows_neon(tile, groups, qa, qa2, da, sa, t, 4, k, out, n, n0);
    switch (rows - t) {
        case 3: q4_tile_rows_neon(tile, groups, qa, qa2, da, sa, t, 3, k, out, n, n0); break;
        case 2: q4_tile_rows_neon(tile, groups, qa, qa2, da, sa, t, 2, k, out, n, n0); break;
        case 1: q4_tile_rows_neon(tile, groups, qa, qa2, da, sa, t, 1, k, out, n, n0); break;
        default: break;
    }
}

NEON_FN static void q8_tile_neon(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                                 int rows, int k, float *out, int n, int n0) {
    int t = 0;
    for (; t + 4 <= rows; t += 4) q8_tile_rows_neon(tile, groups, qa, qa2, da, t, 4, k, out, n, n0);
    switch (rows - t) {
        case 3: q8_tile_rows_neon(tile, groups, qa, qa2, da, t, 3, k, out, n, n0); break;
        case 2: q8_tile_rows_neon(tile, groups, qa, qa2, da, t, 2, k, out, n, n0); break;
        case 1: q8_tile_rows_neon(tile, groups, qa, qa2, da, t, 1, k, out, n, n0); break;
        default: break;
    }
}

const arbor_path arbor_path_neon_dotprod = {quantize_block_neon, q4_tile_neon, q8_tile_neon};
#endif
