/*
 * The decoder layers of a Llama/Qwen2/Qwen3 model in one native call per forward:
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
 * The float kernels (fused_kernels.h over v16.h) exist once per ISA, and every copy does the same
 * float operations in the same order: the AVX-512, AVX2 and NEON paths give the portable path's
 * bits. `isa` (cpu_features.ISA_CODES) picks the copy and goes on to quant_dot.c's products.
 *
 * Keys a row sees: its lane's committed slots [0, context), then the lane's new rows j that its
 * mask allows (causal: j <= i; a tree: mask[i][j]). `slots` holds each lane's slot table from
 * `key_base` on; a lane's new row j writes its K/V to slots[key_base + context + j].
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "v16.h"

#define QK 32

void arbor_quantize_rows(const float *x, int rows, int k, int8_t *q, int8_t *q2, float *d, int32_t *s, int isa);
void arbor_quant_matmul_part(const uint8_t *packed, int bits, const int8_t *qa, const int8_t *qa2, const float *da,
                             const int32_t *sa, int rows, int k, int n, float *out, int isa, int part, int parts);

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

/* Attention goes by tiles: up to MAX_TILE_ROWS consecutive rows of one lane, times one kv head,
   holding at most MAX_TILE_QUERIES (row, query head) pairs; TILE_KEYS keys a pass (fused_kernels.h). */
#define MAX_TILE_ROWS 16
#define MAX_TILE_QUERIES 48
#define TILE_KEYS 32

static int tile_rows(const arbor_dims *dims) {
    const int by_queries = MAX_TILE_QUERIES / (dims->heads / dims->kv_heads);
    return by_queries < 1 ? 1 : (by_queries > MAX_TILE_ROWS ? MAX_TILE_ROWS : by_queries);
}

/* Asks for the rows of the block after next (keys [from + TILE_KEYS, from + 2 TILE_KEYS) of `table`,
   head_dim floats each) into L2 while this one is computed: a decode step's attention streams the
   lane's whole K and V from memory, and alone it read them at ~12 GB/s where one core reads ~28.
   Into L2 (prefetcht1), not L1: L1's few miss buffers were the limit, and asking into them did
   not help (SmolLM2, one row after 4,096 keys, the Zen 4: 20.2 ms a forward, 15.2 with this). */
static inline void prefetch_rows(const float *base, const int32_t *table, int from, int end, int d) {
    from += TILE_KEYS;
    const int last = from + TILE_KEYS < end ? from + TILE_KEYS : end;
    for (int j = from; j < last; j++) {
        const char *row = (const char *)(base + (long)table[j] * d);
        for (int byte = 0; byte < d * (int)sizeof(float); byte += 64) __builtin_prefetch(row + byte, 0, 2);
    }
}

/* one thread's attention scratch: scores [queries][stride], sums [queries][head_dim], new-row slots [rows][max_keys] */
static long tile_scratch_floats(const arbor_dims *dims, int max_keys) {
    const long most = tile_rows(dims), queries = most * (dims->heads / dims->kv_heads);
    return queries * (max_keys + 32) + queries * dims->head_dim + most * (max_keys + 32);
}

/* the attention tiles: consecutive rows of one lane (one key_base), at most tile_rows() a tile;
   tile i is rows [first[i], first[i + 1]). Returns their count. */
static int split_tiles(const arbor_dims *dims, const arbor_rows *row_info, int rows, int *first) {
    const int most = tile_rows(dims);
    int count = 0;
    for (int t = 0; t < rows; t++) {
        if (count == 0 || row_info->key_base[t] != row_info->key_base[first[count - 1]] || t - first[count - 1] >= most)
            first[count++] = t;
    }
    first[count] = rows;
    return count;
}

/* the widest group of query heads a kv head the attention takes: a tile holds one row's at least */
int arbor_max_query_heads_per_kv_head(void) { return MAX_TILE_QUERIES; }

/* x * cos + roll(x, d/2) * signed_sin (rope.py's tables: the first half of sin negated) */
static void rotate(float *x, const float *cos, const float *sin, int d) {
    float rolled[512];
    const int half = d / 2;
    for (int i = 0; i < d; i++) rolled[i] = x[(i + half) % d];
    for (int i = 0; i < d; i++) x[i] = x[i] * cos[i] + rolled[i] * sin[i];
}

/* the float kernels of one ISA (fused_kernels.h's copies), called per row or per attention tile */
typedef struct {
    void (*rms_norm)(const float *x, const float *weight, int n, float eps, float *out);
    void (*attend_tile)(const arbor_dims *dims, const arbor_rows *rows, int t0, int nr, int kv, const float *qkv,
                        int qkv_width, const float *keys, const float *values, float *scratch, long stride,
                        float *attn, int q_width);
    void (*silu_times_up)(const float *gate_up, int first, int end, int inner, float *out);
} layer_kernels;

#define KERNEL(name) name##_portable
#define PV_QUERIES 1
#define SCORE_KEYS 8
#define V(op) portable_##op
#define VEC v16_portable
#define TARGET
#include "fused_kernels.h"
#undef KERNEL
#undef V
#undef VEC
#undef TARGET
#undef PV_QUERIES
#undef SCORE_KEYS

#if defined(__x86_64__)
#define KERNEL(name) name##_avx512
#define PV_QUERIES 3 /* weighted-sum chains a pass: 4 x this many accumulators in registers */
#define SCORE_KEYS 16 /* keys a scores pass: one accumulator each */
#define V(op) avx512_##op
#define VEC v16_avx512
#define TARGET __attribute__((target("avx512f")))
#include "fused_kernels.h"
#undef KERNEL
#undef V
#undef VEC
#undef TARGET
#undef PV_QUERIES
#undef SCORE_KEYS

#define KERNEL(name) name##_avx2
#define PV_QUERIES 1
#define SCORE_KEYS 8
#define V(op) avx2_##op
#define VEC v16_avx2
#define TARGET __attribute__((target("avx2,fma")))
#include "fused_kernels.h"
#undef KERNEL
#undef V
#undef VEC
#undef TARGET
#undef PV_QUERIES
#undef SCORE_KEYS
#endif

#if defined(__aarch64__)
#define KERNEL(name) name##_neon
#define PV_QUERIES 1
#define SCORE_KEYS 8
#define V(op) neon_##op
#define VEC v16_neon
#define TARGET
#include "fused_kernels.h"
#undef KERNEL
#undef V
#undef VEC
#undef TARGET
#undef PV_QUERIES
#undef SCORE_KEYS
#endif

/* cpu_features.ISA_CODES -> the kernels' copy; NULL where this build has none */
static const layer_kernels *kernels_for(int isa) {
    switch (isa) {
        case 0: return &kernels_portable;
#if defined(__x86_64__)
        case 1: return &kernels_avx512;
        case 2: /* AVX2 */
        case 3: return &kernels_avx2; /* AVX-VNNI: AVX2's float ops */
#endif
#if defined(__aarch64__)
        case 4: return &kernels_neon;
#endif
        default: return NULL;
    }
}

/* a hint inside a spin-wait loop: it frees the core's pipeline for a sibling hyperthread */
static inline void spin_hint(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---------- threads: each runs every phase on its share, a spin barrier between phases ---------- */

typedef struct {
    atomic_int arrived, phase;
    int parties;
} spin_barrier;

/* Spins (the wait between phases is microseconds); yields now and then so a thread whose partner
   lost its core (a shared VM) does not burn that core's time. */
static void barrier_wait(spin_barrier *b) {
    const int phase = atomic_load_explicit(&b->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == b->parties - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->phase, phase + 1, memory_order_release);
        return;
    }
    for (long spins = 1; atomic_load_explicit(&b->phase, memory_order_acquire) == phase; spins++) {
        spin_hint();
        if (spins % 256 == 0) sched_yield();
    }
}

typedef struct {
    const arbor_layer *layers;
    int num_layers;
    const arbor_dims *dims;
    float *x;
    int rows;
    const float *cos, *sin;
    const arbor_rows *row_info;
    float *keys, *values;
    float **hidden_out;
    int max_keys, two_term, threads;
    int num_tiles, *tile_first; /* attention tiles: rows [tile_first[i], tile_first[i + 1]) */
    float *h, *qkv, *attn, *proj, *gate_up, *act;
    int8_t *qa, *qa2;
    float *da;
    int32_t *sa;
    const layer_kernels *kernels; /* the float kernels' copy for `isa` */
    int isa;
    spin_barrier barrier;
    atomic_int go; /* set once the thread count is final: threads that did start wait for it */
} forward_ctx;

typedef struct {
    forward_ctx *ctx;
    int part;
    float *scratch; /* this thread's attention scratch */
} forward_part;

static inline int share(int total, int part, int parts) { return (int)((long)total * part / parts); }

/* norm (optional) then quantize this thread's rows of `in` [rows, k] */
static void quantize_part(forward_ctx *c, int part, const float *in, int k) {
    const int first = share(c->rows, part, c->threads), end = share(c->rows, part + 1, c->threads);
    const int groups = k / QK;
    if (end > first)
        arbor_quantize_rows(in + (long)first * k, end - first, k, c->qa + (long)first * k,
                            c->qa2 ? c->qa2 + (long)first * k : NULL, c->da + (long)first * groups,
                            c->sa + (long)first * groups, c->isa);
}

static void product_part(forward_ctx *c, int part, const uint8_t *packed, int bits, int k, int n, float *out) {
    arbor_quant_matmul_part(packed, bits, c->qa, c->qa2, c->da, c->sa, c->rows, k, n, out, c->isa, part, c->threads);
}

static void run_layers(forward_part *me) {
    forward_ctx *c = me->ctx;
    while (!atomic_load_explicit(&c->go, memory_order_acquire)) spin_hint();
    const arbor_dims *dims = c->dims;
    const int part = me->part, parts = c->threads, rows = c->rows;
    const int H = dims->hidden, d = dims->head_dim, inner = dims->inner;
    const int q_width = dims->heads * d, kv_width = dims->kv_heads * d, qkv_width = q_width + 2 * kv_width;
    const long layer_kv = (long)dims->kv_heads * dims->kv_stride * d;
    const int first = share(rows, part, parts), end = share(rows, part + 1, parts);
    const layer_kernels *k = c->kernels;
    for (int l = 0; l < c->num_layers; l++) {
        const arbor_layer *w = c->layers + l;
        float *layer_keys = c->keys + l * layer_kv, *layer_values = c->values + l * layer_kv;
        for (int t = first; t < end; t++) k->rms_norm(c->x + (long)t * H, w->attn_norm, H, dims->eps, c->h + (long)t * H);
        quantize_part(c, part, c->h, H);
        barrier_wait(&c->barrier);
        product_part(c, part, w->qkv, w->qkv_bits, H, qkv_width, c->qkv);
        barrier_wait(&c->barrier);
        for (int t = first; t < end; t++) {
            float *row = c->qkv + (long)t * qkv_width;
            if (w->qkv_bias)
                for (int i = 0; i < qkv_width; i++) row[i] += w->qkv_bias[i];
            for (int head = 0; head < dims->heads + dims->kv_heads; head++) {
                float *piece = row + (long)head * d;
                const float *norm = head < dims->heads ? w->q_norm : w->k_norm;
                if (norm) k->rms_norm(piece, norm, d, dims->eps, piece);
                rotate(piece, c->cos + (long)t * d, c->sin + (long)t * d, d);
            }
            const arbor_rows *ri = c->row_info;
            const int32_t slot = ri->slots[ri->key_base[t] + ri->context[t] + ri->index[t]];
            for (int g = 0; g < dims->kv_heads; g++) {
                const long at = ((long)g * dims->kv_stride + slot) * d;
                memcpy(layer_keys + at, row + q_width + (long)g * d, sizeof(float) * d);
                memcpy(layer_values + at, row + q_width + kv_width + (long)g * d, sizeof(float) * d);
            }
        }
        barrier_wait(&c->barrier);
        const int items = c->num_tiles * dims->kv_heads; /* (tile, kv head) pairs, split evenly */
        for (int item = share(items, part, parts); item < share(items, part + 1, parts); item++) {
            const int tile = item / dims->kv_heads, kv = item % dims->kv_heads;
            const int t0 = c->tile_first[tile], nr = c->tile_first[tile + 1] - t0;
            k->attend_tile(dims, c->row_info, t0, nr, kv, c->qkv, qkv_width, layer_keys, layer_values, me->scratch,
                           c->max_keys + 32, c->attn, q_width);
        }
        barrier_wait(&c->barrier);
        quantize_part(c, part, c->attn, q_width);
        barrier_wait(&c->barrier);
        product_part(c, part, w->o, w->o_bits, q_width, H, c->proj);
        barrier_wait(&c->barrier);
        for (int t = first; t < end; t++) {
            float *xt = c->x + (long)t * H;
            const float *pt = c->proj + (long)t * H;
            for (int i = 0; i < H; i++) xt[i] += pt[i];
            k->rms_norm(xt, w->ffn_norm, H, dims->eps, c->h + (long)t * H);
        }
        quantize_part(c, part, c->h, H);
        barrier_wait(&c->barrier);
        product_part(c, part, w->gate_up, w->gate_up_bits, H, 2 * inner, c->gate_up);
        barrier_wait(&c->barrier);
        k->silu_times_up(c->gate_up, first, end, inner, c->act);
        quantize_part(c, part, c->act, inner);
        barrier_wait(&c->barrier);
        product_part(c, part, w->down, w->down_bits, inner, H, c->proj);
        barrier_wait(&c->barrier);
        for (int t = first; t < end; t++) {
            float *xt = c->x + (long)t * H;
            const float *pt = c->proj + (long)t * H;
            for (int i = 0; i < H; i++) xt[i] += pt[i];
            if (c->hidden_out && c->hidden_out[l]) memcpy(c->hidden_out[l] + (long)t * H, xt, sizeof(float) * H);
        }
        barrier_wait(&c->barrier);
    }
}

static void *run_layers_thread(void *arg) {
    run_layers((forward_part *)arg);
    return NULL;
}

/*
 * x [rows, hidden] (the residual stream, updated in place) through every layer. keys/values: the
 * K/V storage [layers, kv_heads, kv_stride, head_dim]. hidden_out[l], where not NULL, receives x
 * after layer l. `threads` split every phase (rows, tiles of output rows, (row tile, kv head) pairs of
 * attention): a row's numbers never depend on the count. `isa`: cpu_features.ISA_CODES. Returns 0,
 * -1 when scratch cannot be had, -2 for an isa this build has no kernels for, -3 for more than
 * MAX_TILE_QUERIES query heads a kv head.
 */
int arbor_forward_layers(const arbor_layer *layers, int num_layers, const arbor_dims *dims, float *x, int rows,
                         const float *cos, const float *sin, const arbor_rows *row_info, float *keys, float *values,
                         float **hidden_out, int max_keys, int two_term, int threads, int isa) {
    const layer_kernels *kernels = kernels_for(isa);
    if (!kernels) return -2;
    if (dims->heads / dims->kv_heads > MAX_TILE_QUERIES) return -3; /* a tile holds one row's group at least */
    const int H = dims->hidden, d = dims->head_dim, inner = dims->inner;
    const int q_width = dims->heads * d, qkv_width = q_width + 2 * dims->kv_heads * d;
    const int widest = inner > q_width ? (inner > H ? inner : H) : (q_width > H ? q_width : H);
    if (threads < 1) threads = 1;
    if (threads > 16) threads = 16;
    forward_ctx c = {layers, num_layers, dims, x, rows, cos, sin, row_info, keys, values, hidden_out, max_keys,
                     two_term, threads};
    c.kernels = kernels;
    c.isa = isa;
    c.h = malloc(sizeof(float) * (size_t)rows * H);
    c.qkv = malloc(sizeof(float) * (size_t)rows * qkv_width);
    c.attn = malloc(sizeof(float) * (size_t)rows * q_width);
    c.proj = malloc(sizeof(float) * (size_t)rows * H);
    c.gate_up = malloc(sizeof(float) * (size_t)rows * 2 * inner);
    c.act = malloc(sizeof(float) * (size_t)rows * inner);
    c.qa = malloc((size_t)rows * widest);
    c.qa2 = two_term ? malloc((size_t)rows * widest) : NULL;
    c.da = malloc(sizeof(float) * (size_t)rows * (widest / QK));
    c.sa = malloc(sizeof(int32_t) * (size_t)rows * (widest / QK));
    const long scratch_floats = tile_scratch_floats(dims, max_keys);
    float *scratch = malloc(sizeof(float) * (size_t)threads * (size_t)scratch_floats);
    c.tile_first = malloc(sizeof(int) * (size_t)(rows + 1));
    if (c.tile_first) c.num_tiles = split_tiles(dims, row_info, rows, c.tile_first);
    atomic_init(&c.barrier.arrived, 0);
    atomic_init(&c.barrier.phase, 0);
    atomic_init(&c.go, 0);
    c.barrier.parties = threads;
    int status = 0;
    if (!c.h || !c.qkv || !c.attn || !c.proj || !c.gate_up || !c.act || !c.qa || !c.da || !c.sa || !scratch || !c.tile_first ||
        (two_term && !c.qa2)) {
        status = -1;
        goto done;
    }
    forward_part parts[16];
    pthread_t ids[16];
    int started = 1;
    for (int i = 0; i < threads; i++) parts[i] = (forward_part){&c, i, scratch + (long)i * scratch_floats};
    for (; started < threads; started++) {
        if (pthread_create(&ids[started], NULL, run_layers_thread, &parts[started]) != 0) break;
    }
    /* threads that could not be started are done without: the others have not begun */
    c.threads = c.barrier.parties = started;
    atomic_store_explicit(&c.go, 1, memory_order_release);
    run_layers(&parts[0]);
    for (int i = 1; i < started; i++) pthread_join(ids[i], NULL);
done:
    free(c.h); free(c.qkv); free(c.attn); free(c.proj); free(c.gate_up); free(c.act);
    free(c.qa); free(c.qa2); free(c.da); free(c.sa); free(scratch); free(c.tile_first);
    return status;
}
