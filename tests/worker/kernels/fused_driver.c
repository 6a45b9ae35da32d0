/*
 * A fused forward (native/fused_layers.c) on inputs made here from a fixed integer generator, so the
 * same inputs on any machine: test_fused_layers_isa.py builds it for the host and for aarch64 (run
 * under qemu) and compares the bytes it writes.
 *
 *   fused_driver ISA THREADS [REPEATS [smollm2]]
 *
 * writes x, keys and values after the forward to stdout. The small shape (default) has two lanes:
 * a 5-node tree after 19 keys and a 3-row chain after 40 (q/k norms and a q/k/v bias, two layers,
 * head_dim 32); `smollm2` is SmolLM2-135M's shape at one row after 1024 keys, for timing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm, *qkv_bias;
    const uint8_t *qkv, *o, *gate_up, *down;
    int qkv_bits, o_bits, gate_up_bits, down_bits;
} arbor_layer;

typedef struct {
    int hidden, heads, kv_heads, head_dim, inner;
    long kv_stride;
    float eps;
} arbor_dims;

typedef struct {
    const int32_t *key_base, *context, *index, *lane_rows, *mask_offset, *slots;
    const uint8_t *masks;
} arbor_rows;

int arbor_forward_layers(const arbor_layer *layers, int num_layers, const arbor_dims *dims, float *x, int rows,
                         const float *cos, const float *sin, const arbor_rows *row_info, float *keys, float *values,
                         float **hidden_out, int max_keys, int two_term, int threads, int isa);

#define Q4_RECORD 320
#define MAX_LANES 2

static uint32_t state = 12345u;

static uint32_t next_u32(void) {
    state = state * 1664525u + 1013904223u;
    return state;
}

/* uniform in [-1, 1), exactly the same float everywhere */
static float next_float(void) { return (float)(int32_t)(next_u32() >> 8) / 8388608.0f - 1.0f; }

static float *floats(long n, float scale, float offset) {
    float *out = malloc(sizeof(float) * (size_t)n);
    for (long i = 0; i < n; i++) out[i] = offset + scale * next_float();
    return out;
}

/* an int4 weight [n, k] in quant_dot.c's records: random nibbles, scales near 2^-7, minimums near -8 scales */
static uint8_t *q4_weight(int n, int k) {
    const long records = (long)(n / 16) * (k / 32);
    uint8_t *packed = malloc((size_t)records * Q4_RECORD);
    for (long r = 0; r < records; r++) {
        uint8_t *rec = packed + r * Q4_RECORD;
        for (int b = 0; b < 256; b++) rec[b] = (uint8_t)next_u32();
        for (int i = 0; i < 16; i++) {
            const uint16_t d = (uint16_t)(0x2000 | (next_u32() & 0x3ff)), m = (uint16_t)(0xAC00 | (next_u32() & 0x3ff));
            memcpy(rec + 256 + 2 * i, &d, 2);
            memcpy(rec + 288 + 2 * i, &m, 2);
        }
    }
    return packed;
}

static arbor_layer layer(const arbor_dims *dims) {
    const int H = dims->hidden, d = dims->head_dim, qkv = (dims->heads + 2 * dims->kv_heads) * d;
    return (arbor_layer){floats(H, 0.1f, 1.0f), floats(H, 0.1f, 1.0f), floats(d, 0.1f, 1.0f), floats(d, 0.1f, 1.0f),
                         floats(qkv, 0.5f, 0.0f), q4_weight(qkv, H), q4_weight(H, dims->heads * d),
                         q4_weight(2 * dims->inner, H), q4_weight(H, dims->inner), 4, 4, 4, 4};
}

typedef struct {
    int num_lanes, context[MAX_LANES], rows[MAX_LANES];
    const uint8_t *tree; /* lane 0's mask, or NULL */
} lanes;

/* lane 0: root 0; 1, 2 under 0; 3 under 1; 4 under 2 */
static const uint8_t TREE[25] = {1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1};

/* every row's key list (fused_layers.c's arbor_rows); each lane's slots scattered over the storage */
static arbor_rows row_tables(const lanes *ls, long num_slots, int *max_keys) {
    int total = 0, keys = 0;
    for (int l = 0; l < ls->num_lanes; l++) total += ls->rows[l], keys += ls->context[l] + ls->rows[l];
    int32_t *cols = malloc(sizeof(int32_t) * 5 * (size_t)total), *slots = malloc(sizeof(int32_t) * (size_t)keys);
    for (int i = 0; i < keys; i++) slots[i] = (int32_t)((7L * i + 3) % num_slots); /* 7 is prime to num_slots */
    int t = 0, base = 0;
    *max_keys = 1;
    for (int l = 0; l < ls->num_lanes; l++) {
        for (int i = 0; i < ls->rows[l]; i++, t++) {
            cols[t] = base, cols[total + t] = ls->context[l], cols[2 * total + t] = i, cols[3 * total + t] = ls->rows[l];
            cols[4 * total + t] = l == 0 && ls->tree ? 0 : -1;
        }
        base += ls->context[l] + ls->rows[l];
        if (ls->context[l] + ls->rows[l] > *max_keys) *max_keys = ls->context[l] + ls->rows[l];
    }
    return (arbor_rows){cols, cols + total, cols + 2 * total, cols + 3 * total, cols + 4 * total, slots, ls->tree};
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const int isa = atoi(argv[1]), threads = atoi(argv[2]), repeats = argc > 3 ? atoi(argv[3]) : 1;
    const int big = argc > 4 && strcmp(argv[4], "smollm2") == 0;
    const arbor_dims dims = big ? (arbor_dims){576, 9, 3, 64, 1536, 1040, 1e-5f} : (arbor_dims){128, 4, 2, 32, 256, 97, 1e-6f};
    const int num_layers = big ? 30 : 2;
    const lanes ls = big ? (lanes){1, {1024}, {1}, NULL} : (lanes){2, {19, 40}, {5, 3}, TREE};
    arbor_layer layers[30];
    for (int l = 0; l < num_layers; l++) layers[l] = layer(&dims);
    int rows = 0, max_keys;
    for (int l = 0; l < ls.num_lanes; l++) rows += ls.rows[l];
    const arbor_rows tables = row_tables(&ls, dims.kv_stride, &max_keys);
    const long storage = (long)num_layers * dims.kv_heads * dims.kv_stride * dims.head_dim;
    float *keys = floats(storage, 1.0f, 0.0f), *values = floats(storage, 1.0f, 0.0f);
    float *cos = floats((long)rows * dims.head_dim, 1.0f, 0.0f), *sin = floats((long)rows * dims.head_dim, 1.0f, 0.0f);
    float *x0 = floats((long)rows * dims.hidden, 1.0f, 0.0f), *x = malloc(sizeof(float) * (size_t)rows * dims.hidden);
    for (int r = 0; r < repeats; r++) {
        memcpy(x, x0, sizeof(float) * (size_t)rows * dims.hidden);
        const int status = arbor_forward_layers(layers, num_layers, &dims, x, rows, cos, sin, &tables, keys, values,
                                                NULL, max_keys, 1, threads, isa);
        if (status != 0) return 3;
    }
    fwrite(x, sizeof(float), (size_t)rows * dims.hidden, stdout);
    fwrite(keys, sizeof(float), (size_t)storage, stdout);
    fwrite(values, sizeof(float), (size_t)storage, stdout);
    return 0;
}
