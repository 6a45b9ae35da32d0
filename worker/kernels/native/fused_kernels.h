/*
 * The fused layers' float kernels, written once over v16.h: fused_layers.c includes this file once
 * per ISA, with
 *
 *   VEC          that ISA's 16-float vector type (v16_avx512, ...)
 *   V(op)        its operations (avx512_add, ...)
 *   KERNEL(name) this copy's function names (rms_norm_avx512, ...)
 *   TARGET       the target attribute its functions compile under (empty where none is needed)
 *
 * It uses fused_layers.c's arbor_dims, arbor_rows, visible_keys and layer_kernels. Every copy runs
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

/* One head of row t: scores over exactly its visible keys, in slot-list order. `scratch` holds
   2 * (max_keys + 32) floats: the scores, then the visible slots. */
TARGET static void KERNEL(attend_head)(const arbor_dims *dims, const arbor_rows *rows, int t, int h, const float *q_row,
                                       const float *keys, const float *values, float *scratch, float *out_row) {
    const int d = dims->head_dim, group = dims->heads / dims->kv_heads;
    float *scores = scratch;
    int32_t *visible = (int32_t *)(scratch + rows->context[t] + rows->lane_rows[t] + 16);
    const int num_keys = visible_keys(rows, t, visible);
    const float scale = 1.0f / sqrtf((float)d);
    const long head_base = (long)(h / group) * dims->kv_stride;
    const float *q = q_row + (long)h * d;
    float top = -INFINITY;
    for (int j = 0; j < num_keys; j++) {
        scores[j] = KERNEL(dot)(q, keys + (head_base + visible[j]) * d, d) * scale;
        top = scores[j] > top ? scores[j] : top;
    }
    const VEC inv = V(set1)(1.0f / KERNEL(exp_scores)(scores, num_keys, top));
    float *out = out_row + (long)h * d;
    for (int c = 0; c < d; c += 16) {
        VEC acc = V(zero)();
        for (int k = 0; k < num_keys; k++)
            acc = V(fmadd)(V(set1)(scores[k]), V(load)(values + (head_base + visible[k]) * d + c), acc);
        V(store)(out + c, V(mul)(acc, inv));
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

static const layer_kernels KERNEL(kernels) = {KERNEL(rms_norm), KERNEL(attend_head), KERNEL(silu_times_up)};
