/*
 * The fused layers' float kernels, written once over v16.h: fused_layers.c includes this file once
 * per ISA, with
 *
 *   VEC          that ISA's 16-float vector type (v16_avx512, ...)
 *   V(op)        its operations (avx512_add, ...)
 *   KERNEL(name) this copy's function names (rms_norm_avx512, ...)
 *   TARGET       the target attribute its functions compile under (empty where none is needed)
 *
 * It uses fused_layers.c's arbor_dims, arbor_rows, MAX_TILE_ROWS, MAX_TILE_QUERIES, TILE_KEYS,
 * PV_QUERIES and SCORE_KEYS (per ISA) and layer_kernels. Every copy runs
 * the same float operations in the same order, so all give the same bits.
 * Lengths n (head_dim, hidden, inner) are multiples of 16; key counts are not.
 */

/* e^x for x <= 0 (softmax) and moderate positive x (silu's e^-g): Cephes' polynomial on the
   reduced argument r = x - n ln2, times 2^n; within ~2 ulp of expf. The clamp keeps 2^n normal. */
TARGET static inline VEC KERNEL(exp)(VEC x) {
    x = V(max)(V(min)(x, V(set1)(88.0f)), V(set1)(-87.0f));
    const VEC n = V(round)(V(mul)(x, V(set1)(1.44269504088896341f)));
    VEC r = V(fnmadd)(n, V(set1)(0.693359375f), x);
    r = V(fnmadd)(n, V(set1)(-2.12194440e-4f), r);
    VEC p = V(set1)(1.9875691500e-4f);
    p = V(fmadd)(p, r, V(set1)(1.3981999507e-3f));
    p = V(fmadd)(p, r, V(set1)(8.3334519073e-3f));
    p = V(fmadd)(p, r, V(set1)(4.1665795894e-2f));
    p = V(fmadd)(p, r, V(set1)(1.6666665459e-1f));
    p = V(fmadd)(p, r, V(set1)(5.0000001201e-1f));
    p = V(fmadd)(p, V(mul)(r, r), V(add)(r, V(set1)(1.0f)));
    return V(scale2)(p, n);
}

/* sum of a[i] * b[i]: one fused multiply-add chain per lane, then v16.h's tree */
TARGET static inline float KERNEL(dot)(const float *a, const float *b, int n) {
    VEC acc = V(zero)();
    for (int i = 0; i < n; i += 16) acc = V(fmadd)(V(load)(a + i), V(load)(b + i), acc);
    return V(sum)(acc);
}

/* s[j] = dot(q, K[slots[j]]) * scale for j < count: SCORE_KEYS keys at a time (that many independent
   chains in registers, summed by scaled_sums' tree: sixteen on AVX-512's 32 registers, eight
   elsewhere), the rest one by one; either way each score has dot's bits. Dims go 64 at a time,
   each key's 64 read in order, so the reads stay sequential. */
TARGET static void KERNEL(scores)(const float *q, const float *kbase, const int32_t *slots, int count, int d,
                                  float scale, float *s) {
    int j = 0;
    for (; j + SCORE_KEYS <= count; j += SCORE_KEYS) {
        const float *k[SCORE_KEYS];
        VEC part[SCORE_KEYS];
        for (int i = 0; i < SCORE_KEYS; i++) {
            k[i] = kbase + (long)slots[j + i] * d;
            part[i] = V(zero)();
        }
        for (int c0 = 0; c0 < d; c0 += 64) {
            if (d - c0 >= 64) {
                const VEC q0 = V(load)(q + c0), q1 = V(load)(q + c0 + 16), q2 = V(load)(q + c0 + 32),
                          q3 = V(load)(q + c0 + 48);
                for (int i = 0; i < SCORE_KEYS; i++) {
                    part[i] = V(fmadd)(q0, V(load)(k[i] + c0), part[i]);
                    part[i] = V(fmadd)(q1, V(load)(k[i] + c0 + 16), part[i]);
                    part[i] = V(fmadd)(q2, V(load)(k[i] + c0 + 32), part[i]);
                    part[i] = V(fmadd)(q3, V(load)(k[i] + c0 + 48), part[i]);
                }
            } else {
                for (int c = c0; c < d; c += 16) {
                    const VEC qc = V(load)(q + c);
                    for (int i = 0; i < SCORE_KEYS; i++) part[i] = V(fmadd)(qc, V(load)(k[i] + c), part[i]);
                }
            }
        }
        V(scaled_sums)(part, SCORE_KEYS, scale, s + j);
    }
    for (; j < count; j++) s[j] = KERNEL(dot)(q, kbase + (long)slots[j] * d, d) * scale;
}

/* the largest of s[0 .. count): the same value the scan top = s[j] > top ? s[j] : top finds (a
   zero's sign aside, which e^(s - top) does not see) */
TARGET static float KERNEL(max_of)(const float *s, int count) {
    VEC top = V(set1)(-INFINITY);
    int j = 0;
    for (; j + 16 <= count; j += 16) top = V(max)(V(load)(s + j), top);
    float lanes[16], best = -INFINITY;
    V(store)(lanes, top);
    for (int i = 0; i < 16; i++) best = lanes[i] > best ? lanes[i] : best;
    for (; j < count; j++) best = s[j] > best ? s[j] : best;
    return best;
}

TARGET static void KERNEL(rms_norm)(const float *x, const float *weight, int n, float eps, float *out) {
    const float inv = 1.0f / sqrtf(KERNEL(dot)(x, x, n) / (float)n + eps);
    const VEC vinv = V(set1)(inv);
    for (int i = 0; i < n; i += 16) V(store)(out + i, V(mul)(V(load)(weight + i), V(mul)(V(load)(x + i), vinv)));
}

/* scores[j] = e^(scores[j] - top) in place; returns their sum (lane sums in chunk order, then the tree) */
TARGET static float KERNEL(exp_scores)(float *scores, int num_keys, float top) {
    const VEC vtop = V(set1)(top);
    VEC total = V(zero)();
    int j = 0;
    for (; j + 16 <= num_keys; j += 16) {
        const VEC p = KERNEL(exp)(V(sub)(V(load)(scores + j), vtop));
        V(store)(scores + j, p);
        total = V(add)(total, p);
    }
    if (j < num_keys) {
        const int tail = num_keys - j;
        V(store_n)(scores + j, KERNEL(exp)(V(sub)(V(load_n)(scores + j, tail), vtop)), tail);
        total = V(add)(total, V(load_n)(scores + j, tail)); /* the lanes past the tail add zeros */
    }
    return V(sum)(total);
}

/* acc[q] += sum over keys j of p[q][j] * V[slots[j]] on dims [c0, c0 + 16 ch), for nqb queries at once:
   nqb * ch independent multiply-add chains (one chain alone waits out each one's latency, and
   that wait was most of a decode step at 4K keys). Each chain still runs over the keys in order. */
TARGET static inline __attribute__((always_inline)) void KERNEL(weighted_sum_fixed)(
    const int nqb, const int ch, const float *const *p, float *const *acc, const float *vbase, const int32_t *slots,
    int count, int d, int c0) {
    VEC a[3][4];
    for (int q = 0; q < nqb; q++)
        for (int c = 0; c < ch; c++) a[q][c] = V(load)(acc[q] + c0 + 16 * c);
    for (int j = 0; j < count; j++) {
        const float *v = vbase + (long)slots[j] * d + c0;
        VEC row[4];
        for (int c = 0; c < ch; c++) row[c] = V(load)(v + 16 * c);
        for (int q = 0; q < nqb; q++) {
            const VEC weight = V(set1)(p[q][j]);
            for (int c = 0; c < ch; c++) a[q][c] = V(fmadd)(weight, row[c], a[q][c]);
        }
    }
    for (int q = 0; q < nqb; q++)
        for (int c = 0; c < ch; c++) V(store)(acc[q] + c0 + 16 * c, a[q][c]);
}

/* the same for any nqb <= 3 and every 16 dims, the chunks four at a time */
TARGET static void KERNEL(weighted_sum)(int nqb, const float *const *p, float *const *acc, const float *vbase,
                                        const int32_t *slots, int count, int d) {
    for (int c0 = 0; c0 < d; c0 += 64) {
        const int ch = (d - c0) / 16 < 4 ? (d - c0) / 16 : 4;
#define WEIGHTED_SUM_CASE(Q, C) \
    case 4 * (Q) + (C): KERNEL(weighted_sum_fixed)(Q, C, p, acc, vbase, slots, count, d, c0); break;
        switch (4 * nqb + ch) {
            WEIGHTED_SUM_CASE(1, 1) WEIGHTED_SUM_CASE(1, 2) WEIGHTED_SUM_CASE(1, 3) WEIGHTED_SUM_CASE(1, 4)
            WEIGHTED_SUM_CASE(2, 1) WEIGHTED_SUM_CASE(2, 2) WEIGHTED_SUM_CASE(2, 3) WEIGHTED_SUM_CASE(2, 4)
            WEIGHTED_SUM_CASE(3, 1) WEIGHTED_SUM_CASE(3, 2) WEIGHTED_SUM_CASE(3, 3) WEIGHTED_SUM_CASE(3, 4)
            default: break;
        }
#undef WEIGHTED_SUM_CASE
    }
}

/* Attention of a tile: rows [t0, t0 + nr) of one lane (the same committed context) and the `group`
   query heads they each send to kv head `kv`. Every committed key's K and V are read once for the
   whole tile (TILE_KEYS at a time, kept in L1 while each query passes over them), where one row and
   head at a time re-read the lane's K/V per query: at 4K keys that re-read, not the arithmetic, was
   most of a decode step. Each (row, head) still computes what it would alone, in the same order:
   its scores over its visible keys (the committed ones, then the new rows its mask shows), their
   max, e^(s - max) and its sum, and for each 16 dims one fused multiply-add chain over the keys in
   that order; so the tile's make-up never changes a bit.
   `scratch`: tile_scratch_floats(...) floats (fused_layers.c). */
TARGET static void KERNEL(attend_tile)(const arbor_dims *dims, const arbor_rows *rows, int t0, int nr, int kv,
                                       const float *qkv, int qkv_width, const float *keys, const float *values,
                                       float *scratch, long stride, float *attn, int q_width) {
    const int d = dims->head_dim, group = dims->heads / dims->kv_heads, nq = nr * group;
    const int32_t *table = rows->slots + rows->key_base[t0];
    const int context = rows->context[t0], n = rows->lane_rows[t0];
    const float scale = 1.0f / sqrtf((float)d);
    const float *kbase = keys + (long)kv * dims->kv_stride * d, *vbase = values + (long)kv * dims->kv_stride * d;
    float *scores = scratch;                           /* [nq][stride]: committed keys, then the row's new ones */
    float *acc = scratch + (long)nq * stride;          /* [nq][d] */
    int32_t *extra = (int32_t *)(acc + (long)nq * d); /* [nr][n]: each row's visible new-row slots */
    int num_extra[MAX_TILE_ROWS];
    float inv[MAX_TILE_QUERIES];
    for (int r = 0; r < nr; r++) {
        const int t = t0 + r, i = rows->index[t];
        const uint8_t *mask = rows->mask_offset[t] >= 0 ? rows->masks + rows->mask_offset[t] + (long)i * n : NULL;
        int count = 0;
        for (int j = 0; j < n; j++) {
            if (mask ? mask[j] : j <= i) extra[(long)r * n + count++] = table[context + j];
        }
        num_extra[r] = count;
    }
    /* query qv: row t0 + qv / group, head kv * group + qv % group */
#define TILE_QUERY(qv) (qkv + (long)(t0 + (qv) / group) * qkv_width + (long)(kv * group + (qv) % group) * d)
    for (int j0 = 0; j0 < context; j0 += TILE_KEYS) {
        const int j1 = j0 + TILE_KEYS < context ? j0 + TILE_KEYS : context;
        prefetch_rows(kbase, table, j1, context, d);
        for (int qv = 0; qv < nq; qv++)
            KERNEL(scores)(TILE_QUERY(qv), kbase, table + j0, j1 - j0, d, scale, scores + (long)qv * stride + j0);
    }
    for (int qv = 0; qv < nq; qv++) {
        const int r = qv / group, num_keys = context + num_extra[r];
        const float *q = TILE_QUERY(qv);
        float *s = scores + (long)qv * stride;
        KERNEL(scores)(q, kbase, extra + (long)r * n, num_extra[r], d, scale, s + context);
        inv[qv] = 1.0f / KERNEL(exp_scores)(s, num_keys, KERNEL(max_of)(s, num_keys));
        memset(acc + (long)qv * d, 0, sizeof(float) * (size_t)d);
    }
#undef TILE_QUERY
    /* the weighted sums: committed keys a block at a time for every query (PV_QUERIES at once),
       then each row's new keys; then the scale */
    const float *weights[MAX_TILE_QUERIES];
    float *sums[MAX_TILE_QUERIES];
    for (int qv = 0; qv < nq; qv++) {
        weights[qv] = scores + (long)qv * stride;
        sums[qv] = acc + (long)qv * d;
    }
    for (int j0 = 0; j0 < context; j0 += TILE_KEYS) {
        const int j1 = j0 + TILE_KEYS < context ? j0 + TILE_KEYS : context;
        prefetch_rows(vbase, table, j1, context, d);
        const float *block_weights[MAX_TILE_QUERIES];
        for (int qv = 0; qv < nq; qv++) block_weights[qv] = weights[qv] + j0;
        for (int qv = 0; qv < nq; qv += PV_QUERIES) {
            const int nqb = nq - qv < PV_QUERIES ? nq - qv : PV_QUERIES;
            KERNEL(weighted_sum)(nqb, block_weights + qv, sums + qv, vbase, table + j0, j1 - j0, d);
        }
    }
    for (int qv = 0; qv < nq; qv++) {
        const int r = qv / group;
        const float *tail = weights[qv] + context;
        KERNEL(weighted_sum)(1, &tail, sums + qv, vbase, extra + (long)r * n, num_extra[r], d);
        float *out = attn + (long)(t0 + r) * q_width + (long)(kv * group + qv % group) * d;
        const VEC scale_out = V(set1)(inv[qv]);
        for (int c = 0; c < d; c += 16) V(store)(out + c, V(mul)(V(load)(sums[qv] + c), scale_out));
    }
}

/* out[t] = silu(gate[t]) * up[t] for rows [first, end) of gate_up [rows, 2 * inner] */
TARGET static void KERNEL(silu_times_up)(const float *gate_up, int first, int end, int inner, float *out) {
    const VEC one = V(set1)(1.0f);
    for (int t = first; t < end; t++) {
        const float *g = gate_up + (long)t * 2 * inner, *u = g + inner;
        for (int c = 0; c < inner; c += 16) {
            const VEC gv = V(load)(g + c);
            const VEC s = V(div)(gv, V(add)(one, KERNEL(exp)(V(sub)(V(zero)(), gv))));
            V(store)(out + (long)t * inner + c, V(mul)(s, V(load)(u + c)));
        }
    }
}

static const layer_kernels KERNEL(kernels) = {KERNEL(rms_norm), KERNEL(attend_tile), KERNEL(silu_times_up)};
