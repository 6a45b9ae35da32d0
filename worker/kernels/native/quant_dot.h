/*
 * What quant_dot.c (the portable path, dispatch and entry points) shares with the vector paths
 * (quant_dot_avx512.c, quant_dot_avx2.c, quant_dot_neon.c). The record layout and the arithmetic
 * every path must reproduce bit for bit are described at the top of quant_dot.c.
 */
#ifndef ARBOR_QUANT_DOT_H
#define ARBOR_QUANT_DOT_H

#include <stdint.h>
#include <string.h>

#define QK 32
#define TILE 16
#define Q4_RECORD (4 * 64 + 2 * 2 * TILE)         /* 320 bytes */
#define Q8_RECORD (8 * 64 + 2 * TILE + 4 * TILE)  /* 608 bytes */
#define MAX_ROW_BLOCK 4
#define RESIDUAL_STEPS 254 /* the second term's step: the first's / 254, so |q2| <= 127 */
/* software prefetch this far ahead of the record being read: the hardware prefetcher alone left a
   cold weight stream at ~7.5 GB/s on the 2-vCPU Xeon, under what one core can read */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif

/* the `isa` argument of the entry points: cpu_features.ISA_CODES */
enum { ISA_PORTABLE = 0, ISA_AVX512_VNNI = 1, ISA_AVX2 = 2, ISA_AVX_VNNI = 3, ISA_NEON_DOTPROD = 4, NUM_ISAS = 5 };

#if defined(__x86_64__)
#define ARBOR_X86 1
#endif
/* _mm256_dpbusd_avx_epi32 (AVX-VNNI, VEX-encoded) arrived in GCC 11 and clang 12. The test build
   defines ARBOR_AVX_VNNI_VIA_EVEX: the same path on the EVEX form, so that a CPU with AVX-512 VNNI
   but no AVX-VNNI (Zen 4) runs its code. */
#if ARBOR_X86 && (defined(__AVXVNNI__) || defined(ARBOR_AVX_VNNI_VIA_EVEX) || \
                  (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define ARBOR_HAVE_AVX_VNNI 1
#endif

/* one (tile, rows) product: out[t, n0 .. n0 + 15] for t < rows (columns past n dropped) */
typedef void q4_tile_fn(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                        const int32_t *sa, int rows, int k, float *out, int n, int n0);
typedef void q8_tile_fn(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2, const float *da,
                        int rows, int k, float *out, int n, int n0);
/* one block of 32 activations: q (and q2 when not NULL), its scale d and sum s */
typedef void quantize_block_fn(const float *x, int8_t *q, int8_t *q2, float *d, int32_t *s);

typedef struct {
    quantize_block_fn *quantize_block;
    q4_tile_fn *q4_tile;
    q8_tile_fn *q8_tile;
} arbor_path;

extern const arbor_path arbor_path_portable;
#if ARBOR_X86
extern const arbor_path arbor_path_avx512_vnni, arbor_path_avx2;
#if ARBOR_HAVE_AVX_VNNI
extern const arbor_path arbor_path_avx_vnni;
#endif
#endif
#if defined(__aarch64__)
extern const arbor_path arbor_path_neon_dotprod;
#endif

static inline int32_t load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the portable block quantizer: every path's quantize_block computes these bits */
void arbor_quantize_block_portable(const float *x, int8_t *q, int8_t *q2, float *d, int32_t *s);
/* the avx2 quantizer, shared by the AVX2 and AVX-VNNI paths */
void arbor_quantize_block_avx2(const float *x, int8_t *q, int8_t *q2, float *d, int32_t *s);

#endif
