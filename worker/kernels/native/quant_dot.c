/*
 * Arbor's native CPU kernels: weight-only int4 (GGUF Q4_0/Q4_1) and int8 (Q8_0) matrices times
 * activations quantized to int8 per block of 32, as llama.cpp's Q8_1 does.
 *
 * Arithmetic, per activation row t and output row n (g runs over the blocks of 32 along K):
 *
 *     int4:  y[t, n] = sum_g  d_w[n,g] * d_a[t,g] * dot(q_w[n,g], q_a[t,g])  +  m_w[n,g] * (d_a[t,g] * s_a[t,g])
 *     int8:  y[t, n] = sum_g  d_w[n,g] * d_a[t,g] * dot(q_w[n,g], q_a[t,g])
 *
 * q_w in 0..15 (int4, w = q * d + m) or -128..127 (int8, w = q * d), q_a in -127..127 with
 * x ~= q_a * d_a, s_a = sum of a block's q_a.
 *
 * Two-term activations (the default: int8 alone moved greedy output away from float32 far more than
 * bfloat16 activations did): each block also keeps its rounding residual as a second int8 term,
 * x ~= d * q1 + (d / 254) * q2, so x ~= d_a * (254 q1 + q2) with d_a = d / 254: 16-bit precision
 * from two byte dot products. The kernels then take q_a as 254 * dot(w, q1) + dot(w, q2) (exact in
 * int32) and s_a as 254 * s1 + s2; the float work per block is unchanged. Each block's dot product is an exact int32; the
 * float sum over blocks runs in one fixed order with fused multiply-adds, and the same order on
 * every path, so a row's result is bitwise the same whatever the number of rows in the call, the
 * rows beside it, the thread that computes it, or the path (AVX-512 VNNI or portable C).
 *
 * Weight layout: output rows in tiles of 16 (one 512-bit register holds a tile's 16 sums). For
 * every (tile, block) one record:
 *     int4: 4 x 64 bytes of nibbles: chunk c, lane r holds 4 bytes; byte b's low nibble is
 *           q[r, 32g + 4c + b], its high nibble q[r, 32g + 16 + 4c + b]; then d[16], m[16] fp16.
 *     int8: 8 x 64 bytes: chunk c, lane r holds q[r, 32g + 4c .. 4c + 3]; then d[16] fp16 and
 *           c[16] int32 = -128 * sum of the block's q (vpdpbusd multiplies unsigned by signed
 *           bytes: the activation goes in as q_a + 128 and this takes the 128s back out).
 * Rows past N in the last tile are zeros.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define ARBOR_X86 1
#endif

#define QK 32
#define TILE 16
#define Q4_RECORD (4 * 64 + 2 * 2 * TILE)         /* 320 bytes */
#define Q8_RECORD (8 * 64 + 2 * TILE + 4 * TILE)  /* 608 bytes */
#define MAX_ROW_BLOCK 4
/* software prefetch this far ahead of the record being read: the hardware prefetcher alone left a
   cold weight stream at ~7.5 GB/s on the 2-vCPU Xeon, under what one core can read */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif

int arbor_q4_record_bytes(void) { return Q4_RECORD; }
int arbor_q8_record_bytes(void) { return Q8_RECORD; }

/* ---------- fp16 <-> fp32, portable (exact both ways for the values we store) ---------- */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---------- activation quantization (per row, per block of 32) ---------- */

#define RESIDUAL_STEPS 254 /* the second term's step: the first's / 254, so |q2| <= 127 */

static void quantize_block_portable(const float *x, int8_t *q, int8_t *q2, float *d, int32_t *s) {
    float amax = 0.0f;
    for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const float id2 = id * (float)RESIDUAL_STEPS;
    int32_t sum = 0, sum2 = 0;
    for (int i = 0; i < QK; i++) {
        const int v = (int)nearbyintf(x[i] * id);
        q[i] = (int8_t)v;
        sum += v;
        if (q2) {
            const int r = (int)nearbyintf(fmaf(-(float)v, dd, x[i]) * id2);
            const int clamped = r > 127 ? 127 : (r < -127 ? -127 : r);
            q2[i] = (int8_t)clamped;
            sum2 += clamped;
        }
    }
    *d = q2 ? dd / (float)RESIDUAL_STEPS : dd;
    *s = q2 ? sum * RESIDUAL_STEPS + sum2 : sum;
}

#ifdef ARBOR_X86
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
#endif

/* x [rows, k] float32 -> q [rows, k] int8, d [rows, k/32] float32, s [rows, k/32] int32; with q2
   [rows, k] (not NULL) the residual term too, d and s then as the header says */
void arbor_quantize_rows(const float *x, int rows, int k, int8_t *q, int8_t *q2, float *d, int32_t *s, int isa) {
    const int groups = k / QK;
    for (int t = 0; t < rows; t++) {
        for (int g = 0; g < groups; g++) {
            const long at = (long)t * k + (long)g * QK, ag = (long)t * groups + g;
            int8_t *residual = q2 ? q2 + at : NULL;
#ifdef ARBOR_X86
            if (isa == 1) {
                quantize_block_avx512(x + at, q + at, residual, d + ag, s + ag);
                continue;
            }
#endif
            quantize_block_portable(x + at, q + at, residual, d + ag, s + ag);
        }
    }
}

/* ---------- the portable path: the same sums in the same order ---------- */

static int32_t q4_dot_portable(const uint8_t *rec, int r, const int8_t *a) {
    int32_t dot = 0;
    for (int c = 0; c < 4; c++) {
        for (int b = 0; b < 4; b++) {
            const uint8_t byte = rec[c * 64 + r * 4 + b];
            dot += (int32_t)(byte & 15) * a[4 * c + b] + (int32_t)(byte >> 4) * a[16 + 4 * c + b];
        }
    }
    return dot;
}

static int32_t q8_dot_portable(const uint8_t *rec, int r, const int8_t *a) {
    int32_t dot = ((const int32_t *)(rec + 544))[r];
    for (int c = 0; c < 8; c++) {
        for (int b = 0; b < 4; b++) dot += (int32_t)((int8_t)rec[c * 64 + r * 4 + b]) * ((int32_t)a[4 * c + b] + 128);
    }
    return dot;
}

static void q4_tile_portable(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                             const int32_t *sa, int rows, int k, float *out, int n, int n0) {
    for (int t = 0; t < rows; t++) {
        float sum[TILE] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *rec = tile + (long)g * Q4_RECORD;
            const uint16_t *dw = (const uint16_t *)(rec + 256), *mw = (const uint16_t *)(rec + 288);
            const long at = (long)t * k + (long)g * QK;
            const float dat = da[(long)t * groups + g], mterm = dat * (float)sa[(long)t * groups + g];
            for (int r = 0; r < TILE; r++) {
                int32_t dot = q4_dot_portable(rec, r, qa + at);
                if (qa2) dot = dot * RESIDUAL_STEPS + q4_dot_portable(rec, r, qa2 + at);
                const float scale = half_to_float(dw[r]) * dat;
                sum[r] = fmaf((float)dot, scale, sum[r]);
                sum[r] = fmaf(half_to_float(mw[r]), mterm, sum[r]);
            }
        }
        for (int r = 0; r < TILE && n0 + r < n; r++) out[(long)t * n + n0 + r] = sum[r];
    }
}

static void q8_tile_portable(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                             int rows, int k, float *out, int n, int n0) {
    for (int t = 0; t < rows; t++) {
        float sum[TILE] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *rec = tile + (long)g * Q8_RECORD;
            const uint16_t *dw = (const uint16_t *)(rec + 512);
            const long at = (long)t * k + (long)g * QK;
            const float dat = da[(long)t * groups + g];
            for (int r = 0; r < TILE; r++) {
                int32_t dot = q8_dot_portable(rec, r, qa + at);
                if (qa2) dot = dot * RESIDUAL_STEPS + q8_dot_portable(rec, r, qa2 + at);
                sum[r] = fmaf((float)dot, half_to_float(dw[r]) * dat, sum[r]);
            }
        }
        for (int r = 0; r < TILE && n0 + r < n; r++) out[(long)t * n + n0 + r] = sum[r];
    }
}

/* ---------- AVX-512 VNNI ---------- */

#ifdef ARBOR_X86
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c"), always_inline)) static inline

static inline int32_t load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

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
#endif

/* ---------- entry points ---------- */

typedef struct {
    const uint8_t *packed;
    const int8_t *qa, *qa2;
    const float *da;
    const int32_t *sa;
    float *out;
    int rows, k, n, isa, bits, tile_begin, tile_end;
} matmul_job;

static void run_tiles(const matmul_job *job) {
    const int groups = job->k / QK;
    const int record = job->bits == 4 ? Q4_RECORD : Q8_RECORD;
    /* rows of activations in blocks of 64, so a block's quantized rows stay in L1 across the tiles */
    for (int t0 = 0; t0 < job->rows; t0 += 64) {
        const int nr = job->rows - t0 < 64 ? job->rows - t0 : 64;
        const int8_t *qa = job->qa + (long)t0 * job->k;
        const int8_t *qa2 = job->qa2 ? job->qa2 + (long)t0 * job->k : NULL;
        const float *da = job->da + (long)t0 * groups;
        const int32_t *sa = job->sa + (long)t0 * groups;
        float *out = job->out + (long)t0 * job->n;
        for (int tile = job->tile_begin; tile < job->tile_end; tile++) {
            const uint8_t *w = job->packed + (long)tile * groups * record;
            const int n0 = tile * TILE;
#ifdef ARBOR_X86
            if (job->isa == 1) {
                if (job->bits == 4) q4_tile_vnni(w, groups, qa, qa2, da, sa, nr, job->k, out, job->n, n0);
                else q8_tile_vnni(w, groups, qa, qa2, da, nr, job->k, out, job->n, n0);
                continue;
            }
#endif
            if (job->bits == 4) q4_tile_portable(w, groups, qa, qa2, da, sa, nr, job->k, out, job->n, n0);
            else q8_tile_portable(w, groups, qa, qa2, da, nr, job->k, out, job->n, n0);
        }
    }
}

static void *run_tiles_thread(void *arg) {
    run_tiles((const matmul_job *)arg);
    return NULL;
}

/*
 * out [rows, n] float32 = quantized activations (q_a [rows, k], q_a2 or NULL, d_a, s_a [rows, k/32]) times the
 * packed weight. `threads` > 1 splits the tiles (output rows) into contiguous ranges, one a thread:
 * a row's sums never cross threads, so the result does not depend on the count.
 */
void arbor_quant_matmul(const uint8_t *packed, int bits, const int8_t *qa, const int8_t *qa2, const float *da,
                        const int32_t *sa, int rows, int k, int n, float *out, int isa, int threads) {
    const int tiles = (n + TILE - 1) / TILE;
    if (threads > tiles) threads = tiles;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    matmul_job jobs[64];
    pthread_t ids[64];
    for (int i = 0; i < threads; i++) {
        jobs[i] = (matmul_job){packed, qa, qa2, da, sa, out, rows, k, n, isa, bits,
                               (int)((long)tiles * i / threads), (int)((long)tiles * (i + 1) / threads)};
    }
    for (int i = 1; i < threads; i++) pthread_create(&ids[i], NULL, run_tiles_thread, &jobs[i]);
    run_tiles(&jobs[0]);
    for (int i = 1; i < threads; i++) pthread_join(ids[i], NULL);
}

/* One thread's share of a product: tiles [part * tiles / parts, (part + 1) * tiles / parts). */
void arbor_quant_matmul_part(const uint8_t *packed, int bits, const int8_t *qa, const int8_t *qa2, const float *da,
                             const int32_t *sa, int rows, int k, int n, float *out, int isa, int part, int parts) {
    const int tiles = (n + TILE - 1) / TILE;
    const matmul_job job = {packed, qa, qa2, da, sa, out, rows, k, n, isa, bits,
                            (int)((long)tiles * part / parts), (int)((long)tiles * (part + 1) / parts)};
    run_tiles(&job);
}

/* 1 when this CPU runs the AVX-512 VNNI path (checked at run time, whatever the build machine was) */
int arbor_cpu_has_avx512_vnni(void) {
#ifdef ARBOR_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}
