/*
 * The decoder layers of a Llama/Qwen2/Qwen3 model in one native call per forward (AVX-512 VNNI only):
 *
 *   h = rmsnorm(x) ; qkv = h Wqkv (+ bias) ; q/k normed (Qwen3) and rotated ; K/V written to their slots ;
 *   attention of each row over exactly its visible keys ; x += attn Wo ;
 *   h = rmsnorm(x) ; g, u = h Wgate_up ; x += (silu(g) * u) Wdown
 *
 * with every product on quant_dot.c's kernels. Each row is computed on its own, in a fixed order
 * (norms, dot products, the softmax and the weighted sum over its keys in slot-list order), so a
 * row's result is bitwise the same whatever rows share the call: decoding alone, verifying a chain
 * or a tree, beside other lanes, or as part of a prefill chunk.
 *
 * Keys a row sees: its lane's committed slots [0, context), then the lane's new rows j that its
 * mask allows (causal: j <= i; a tree: mask[i][j]). `slots` holds each lane's slot table from
 * `key_base` on; a lane's new row j writes its K/V to slots[key_base + context + j].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define QK 32
#define TILE 16
#define FUSED __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c")))

void arbor_quantize_rows(const float *x, int rows, int k, int8_t *q, int8_t *q2, float *d, int32_t *s, int isa);
void arbor_quant_matmul(const uint8_t *packed, int bits, const int8_t *qa, const int8_t *qa2, const float *da,
                        const int32_t *sa, int rows, int k, int n, float *out, int isa, int threads);

typedef struct {
    const float *attn_norm, *ffn_norm; /* [hidden] */
    const float *q_norm, *k_norm;      /* [head_dim] or NULL */
    const float *qkv_bias;             /* [(heads + 2 kv_heads) * head_dim] or NULL */
    const uint8_t *qkv, *o, *gate_up, *down;
    int qkv_bits, o_bits, gate_up_bits, down_bits;
} arbor_layer;

typedef struct {
    int hidden, heads, kv_heads, head_dim, inner;
    long kv_stride; /* slots per kv head in one layer's K/V: [kv_heads, kv_stride, head_dim] */
    float eps;
} arbor_dims;

typedef struct {
    const int32_t *key_base, *context, *index, *lane_rows, *mask_offset; /* [rows] each */
    const int32_t *slots;                                                /* lanes' slot tables */
    const uint8_t *masks;                                                /* [lane_rows, lane_rows] per tree lane */
} arbor_rows;

/* e^x for x <= 0 (softmax) and moderate positive x (silu's e^-g): Cephes' polynomial on the
   reduced argument, 2^n by scalef; within ~2 ulp of expf */
FUSED static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), 0);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* sum of a[i] * b[i], n a multiple of 16, lanes reduced in one fixed order */
FUSED static inline float dot(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    return _mm512_reduce_add_ps(acc);
}

FUSED static void rms_norm(const float *x, const float *weight, int n, float eps, float *out) {
    const float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int i = 0; i < n; i += 16) {
        const __m512 h = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(weight + i), h));
    }
}

/* x * cos + roll(x, d/2) * signed_sin (rope.py's tables: the first half of sin negated) */
static void rotate(float *x, const float *cos, const float *sin, int d) {
    float rolled[512];
    const int half = d / 2;
    for (int i = 0; i < d; i++) rolled[i] = x[(i + half) % d];
    for (int i = 0; i < d; i++) x[i] = x[i] * cos[i] + rolled[i] * sin[i];
}

/* qa2 NULL: one-term activations; else two-term (quant_dot.c's header) */
static void product(const uint8_t *packed, int bits, const float *in, int rows, int k, int n, float *out,
                    int8_t *qa, int8_t *qa2, float *da, int32_t *sa) {
    arbor_quantize_rows(in, rows, k, qa, qa2, da, sa, 1);
    arbor_quant_matmul(packed, bits, qa, qa2, da, sa, rows, k, n, out, 1, 1);
}

FUSED static void attend_row(const arbor_dims *dims, const arbor_rows *rows, int t, const float *q_row,
                             const float *keys, const float *values, float *scores, float *out_row) {
    const int d = dims->head_dim, group = dims->heads / dims->kv_heads;
    const int32_t *table = rows->slots + rows->key_base[t];
    const int context = rows->context[t], i = rows->index[t], n = rows->lane_rows[t];
    const uint8_t *mask = rows->mask_offset[t] >= 0 ? rows->masks + rows->mask_offset[t] + (long)i * n : NULL;
    int num_keys = 0;
    int32_t *visible = (int32_t *)(scores + context + n); /* slot list after the scores */
    for (int j = 0; j < context; j++) visible[num_keys++] = table[j];
    for (int j = 0; j < n; j++) {
        if (mask ? mask[j] : j <= i) visible[num_keys++] = table[context + j];
    }
    const float scale = 1.0f / sqrtf((float)d);
    for (int h = 0; h < dims->heads; h++) {
        const long head_base = (long)(h / group) * dims->kv_stride;
        const float *q = q_row + (long)h * d;
        float top = -INFINITY;
        for (int j = 0; j < num_keys; j++) {
            scores[j] = dot(q, keys + (head_base + visible[j]) * d, d) * scale;
            top = scores[j] > top ? scores[j] : top;
        }
        __m512 total = _mm512_setzero_ps();
        int j = 0;
        for (; j + 16 <= num_keys; j += 16) {
            const __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(scores + j), _mm512_set1_ps(top)));
            _mm512_storeu_ps(scores + j, p);
            total = _mm512_add_ps(total, p);
        }
        if (j < num_keys) {
            const __mmask16 tail = (__mmask16)((1u << (num_keys - j)) - 1);
            const __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + j), _mm512_set1_ps(top)));
            _mm512_mask_storeu_ps(scores + j, tail, p);
            total = _mm512_add_ps(total, _mm512_maskz_mov_ps(tail, p));
        }
        const float inv = 1.0f / _mm512_reduce_add_ps(total);
        float *out = out_row + (long)h * d;
        for (int c = 0; c < d; c += 16) {
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < num_keys; k++) {
                const __m512 v = _mm512_loadu_ps(values + (head_base + visible[k]) * d + c);
                acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[k]), v, acc);
            }
            _mm512_storeu_ps(out + c, _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
        }
    }
}

FUSED static void silu_times_up(const float *gate_up, int rows, int inner, float *out) {
    for (int t = 0; t < rows; t++) {
        const float *g = gate_up + (long)t * 2 * inner, *u = g + inner;
        for (int c = 0; c < inner; c += 16) {
            const __m512 gv = _mm512_loadu_ps(g + c);
            const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
            _mm512_storeu_ps(out + (long)t * inner + c, _mm512_mul_ps(s, _mm512_loadu_ps(u + c)));
        }
    }
}

/*
 * x [rows, hidden] (the residual stream, updated in place) through every layer. keys/values: the
 * K/V storage [layers, kv_heads, kv_stride, head_dim]. hidden_out[l], where not NULL, receives x
 * after layer l. Returns 0, or -1 when a scratch allocation fails.
 */
FUSED int arbor_forward_layers(const arbor_layer *layers, int num_layers, const arbor_dims *dims, float *x, int rows,
                               const float *cos, const float *sin, const arbor_rows *row_info, float *keys,
                               float *values, float **hidden_out, int max_keys, int two_term) {
    const int H = dims->hidden, d = dims->head_dim, inner = dims->inner;
    const int q_width = dims->heads * d, kv_width = dims->kv_heads * d, qkv_width = q_width + 2 * kv_width;
    const int widest = inner > q_width ? (inner > H ? inner : H) : (q_width > H ? q_width : H);
    const long layer_kv = (long)dims->kv_heads * dims->kv_stride * d;
    float *h = malloc(sizeof(float) * (size_t)rows * H);
    float *qkv = malloc(sizeof(float) * (size_t)rows * qkv_width);
    float *attn = malloc(sizeof(float) * (size_t)rows * q_width);
    float *proj = malloc(sizeof(float) * (size_t)rows * H);
    float *gate_up = malloc(sizeof(float) * (size_t)rows * 2 * inner);
    float *act = malloc(sizeof(float) * (size_t)rows * inner);
    float *scores = malloc(sizeof(float) * (size_t)2 * (max_keys + 16));
    int8_t *qa = malloc((size_t)rows * widest);
    int8_t *qa2 = two_term ? malloc((size_t)rows * widest) : NULL;
    float *da = malloc(sizeof(float) * (size_t)rows * (widest / QK));
    int32_t *sa = malloc(sizeof(int32_t) * (size_t)rows * (widest / QK));
    int status = 0;
    if (!h || !qkv || !attn || !proj || !gate_up || !act || !scores || !qa || !da || !sa || (two_term && !qa2)) {
        status = -1;
        goto done;
    }
    for (int l = 0; l < num_layers; l++) {
        const arbor_layer *w = layers + l;
        float *layer_keys = keys + l * layer_kv, *layer_values = values + l * layer_kv;
        for (int t = 0; t < rows; t++) rms_norm(x + (long)t * H, w->attn_norm, H, dims->eps, h + (long)t * H);
        product(w->qkv, w->qkv_bits, h, rows, H, qkv_width, qkv, qa, qa2, da, sa);
        for (int t = 0; t < rows; t++) {
            float *row = qkv + (long)t * qkv_width;
            if (w->qkv_bias)
                for (int c = 0; c < qkv_width; c++) row[c] += w->qkv_bias[c];
            for (int head = 0; head < dims->heads + dims->kv_heads; head++) {
                float *part = row + (long)head * d;
                const float *norm = head < dims->heads ? w->q_norm : w->k_norm;
                if (norm) rms_norm(part, norm, d, dims->eps, part);
                rotate(part, cos + (long)t * d, sin + (long)t * d, d);
            }
            const int32_t slot = row_info->slots[row_info->key_base[t] + row_info->context[t] + row_info->index[t]];
            for (int g = 0; g < dims->kv_heads; g++) {
                const long at = ((long)g * dims->kv_stride + slot) * d;
                memcpy(layer_keys + at, row + q_width + (long)g * d, sizeof(float) * d);
                memcpy(layer_values + at, row + q_width + kv_width + (long)g * d, sizeof(float) * d);
            }
        }
        for (int t = 0; t < rows; t++)
            attend_row(dims, row_info, t, qkv + (long)t * qkv_width, layer_keys, layer_values, scores,
                       attn + (long)t * q_width);
        product(w->o, w->o_bits, attn, rows, q_width, H, proj, qa, qa2, da, sa);
        for (long i = 0; i < (long)rows * H; i++) x[i] += proj[i];
        for (int t = 0; t < rows; t++) rms_norm(x + (long)t * H, w->ffn_norm, H, dims->eps, h + (long)t * H);
        product(w->gate_up, w->gate_up_bits, h, rows, H, 2 * inner, gate_up, qa, qa2, da, sa);
        silu_times_up(gate_up, rows, inner, act);
        product(w->down, w->down_bits, act, rows, inner, H, proj, qa, qa2, da, sa);
        for (long i = 0; i < (long)rows * H; i++) x[i] += proj[i];
        if (hidden_out && hidden_out[l]) memcpy(hidden_out[l], x, sizeof(float) * (size_t)rows * H);
    }
done:
    free(h); free(qkv); free(attn); free(proj); free(gate_up); free(act); free(scores); free(qa); free(qa2); free(da); free(sa);
    return status;
}
#endif
