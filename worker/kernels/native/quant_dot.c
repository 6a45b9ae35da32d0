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
 * rows beside it, the thread that computes it, or the path.
 *
 * Paths (cpu_features.ISA_CODES; each in its own file, chosen per call by `isa`): portable C (0, here),
 * AVX-512 VNNI (1, quant_dot_avx512.c), AVX2 (2) and AVX-VNNI (3, quant_dot_avx2.c), NEON with
 * dot products (4, quant_dot_neon.c). Each computes every (row, block) dot product as the exact int32
 * and then the two fused multiply-adds below, in block order; the build's -ffp-contract=off keeps
 * the compiler from fusing anything else.
 *
 * Weight layout: output rows in tiles of 16 (one 512-bit register holds a tile's 16 sums). For
 * every (tile, block) one record:
 *     int4: 4 x 64 bytes of nibbles: chunk c, lane r holds 4 bytes; byte b's low nibble is
 *           q[r, 32g + 4c + b], its high nibble q[r, 32g + 16 + 4c + b]; then d[16], m[16] fp16.
 *     int8: 8 x 64 bytes: chunk c, lane r holds q[r, 32g + 4c .. 4c + 3]; then d[16] fp16 and
 *           c[16] int32 = -128 * sum of the block's q (vpdpbusd multiplies unsigned by signed
 *           bytes: the activation goes in as q_a + 128 and this takes the 128s back out; the AVX2
 *           and NEON paths compute sum(q_w q_a) directly, the same int32).
 * Rows past N in the last tile are zeros.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "quant_dot.h"

#if ARBOR_X86
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

static const arbor_path *path_for(int isa);

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

void arbor_quantize_block_portable(const float *x, int8_t *q, int8_t *q2, float *d, int32_t *s) {
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


/* x [rows, k] float32 -> q [rows, k] int8, d [rows, k/32] float32, s [rows, k/32] int32; with q2
   [rows, k] (not NULL) the residual term too, d and s then as the header says */
void arbor_quantize_rows(const float *x, int rows, int k, int8_t *q, int8_t *q2, float *d, int32_t *s, int isa) {
    quantize_block_fn *quantize_block = path_for(isa)->quantize_block;
    const int groups = k / QK;
    for (int t = 0; t < rows; t++) {
        for (int g = 0; g < groups; g++) {
            const long at = (long)t * k + (long)g * QK, ag = (long)t * groups + g;
            int8_t *residual = q2 ? q2 + at : NULL;
            quantize_block(x + at, q + at, residual, d + ag, s + ag);
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

const arbor_path arbor_path_portable = {arbor_quantize_block_portable, q4_tile_portable, q8_tile_portable};

/* ---------- dispatch ---------- */

#if ARBOR_X86
/* one CPUID feature bit (register 0-3: eax, ebx, ecx, edx), for the features clang before 15 and
   gcc before 11 cannot name to __builtin_cpu_supports (f16c, avxvnni) */
static int cpuid_bit(unsigned leaf, unsigned subleaf, int reg, int bit) {
    unsigned r[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (int)((r[reg] >> bit) & 1);
}
#endif

/* 1 when this CPU runs path `isa` and this build has it (checked at run time, whatever the build
   machine was): loading never runs an instruction the CPU lacks. __builtin_cpu_supports("avx2")
   also checks that the OS saves the 256-bit registers. */
int arbor_cpu_supports(int isa) {
    if (isa == ISA_PORTABLE) return 1;
#if ARBOR_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpuid_bit(1, 0, 2, 29);
    if (isa == ISA_AVX512_VNNI) {
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
    if (isa == ISA_AVX2) return avx2;
#if ARBOR_HAVE_AVX_VNNI && defined(ARBOR_AVX_VNNI_VIA_EVEX)
    if (isa == ISA_AVX_VNNI) return avx2 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#elif ARBOR_HAVE_AVX_VNNI
    if (isa == ISA_AVX_VNNI) return avx2 && cpuid_bit(7, 1, 0, 4);
#endif
#endif
#if defined(__aarch64__)
    if (isa == ISA_NEON_DOTPROD) return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    return 0;
}

/* the fastest path this CPU runs (the C side's own choice; the worker decides in cpu_features.py) */
int arbor_best_isa(void) {
    static const int order[] = {ISA_AVX512_VNNI, ISA_AVX_VNNI, ISA_AVX2, ISA_NEON_DOTPROD};
    for (int i = 0; i < 4; i++) {
        if (arbor_cpu_supports(order[i])) return order[i];
    }
    return ISA_PORTABLE;
}

static const arbor_path *path_for(int isa) {
    switch (isa) {
#if ARBOR_X86
        case ISA_AVX512_VNNI: return &arbor_path_avx512_vnni;
        case ISA_AVX2: return &arbor_path_avx2;
#if ARBOR_HAVE_AVX_VNNI
        case ISA_AVX_VNNI: return &arbor_path_avx_vnni;
#endif
#endif
#if defined(__aarch64__)
        case ISA_NEON_DOTPROD: return &arbor_path_neon_dotprod;
#endif
        default: return &arbor_path_portable;
    }
}

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
    const arbor_path *path = path_for(job->isa);
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
            if (job->bits == 4) path->q4_tile(w, groups, qa, qa2, da, sa, nr, job->k, out, job->n, n0);
            else path->q8_tile(w, groups, qa, qa2, da, nr, job->k, out, job->n, n0);
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
