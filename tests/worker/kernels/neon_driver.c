/*
 * Runs native/quant_dot*.c's entry points on cases read from a file, on the path the library itself
 * picks (arbor_best_isa: NEON with dot products where the CPU has it, else portable), and writes what
 * they computed; test_kernels_under_qemu.py cross-compiles it for aarch64 and runs it under qemu.
 *
 * Input, repeated to the end of the file: int32 bits, two_term, rows, k, n, packed_bytes; the packed
 * weight (packed_bytes); x (rows * k float32).
 * Output: int32 the path run; then per case q (rows * k int8), q2 (likewise, if two_term),
 * d (rows * k/32 float32), s (rows * k/32 int32), out (rows * n float32).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int arbor_best_isa(void);
void arbor_quantize_rows(const float *x, int rows, int k, int8_t *q, int8_t *q2, float *d, int32_t *s, int isa);
void arbor_quant_matmul(const uint8_t *packed, int bits, const int8_t *qa, const int8_t *qa2, const float *da,
                        const int32_t *sa, int rows, int k, int n, float *out, int isa, int threads);

static void *read_exactly(FILE *in, size_t bytes) {
    void *data = malloc(bytes ? bytes : 1);
    if (!data || fread(data, 1, bytes, in) != bytes) {
        fprintf(stderr, "short input\n");
        exit(2);
    }
    return data;
}

static void run_case(const int32_t *head, FILE *in, FILE *out, int isa) {
    const int bits = head[0], two_term = head[1], rows = head[2], k = head[3], n = head[4];
    const size_t values = (size_t)rows * k, blocks = (size_t)rows * (k / 32);
    uint8_t *packed = read_exactly(in, (size_t)head[5]);
    float *x = read_exactly(in, values * sizeof(float));
    int8_t *q = malloc(values), *q2 = two_term ? malloc(values) : NULL;
    float *d = malloc(blocks * sizeof(float)), *y = malloc((size_t)rows * n * sizeof(float));
    int32_t *s = malloc(blocks * sizeof(int32_t));
    arbor_quantize_rows(x, rows, k, q, q2, d, s, isa);
    arbor_quant_matmul(packed, bits, q, q2, d, s, rows, k, n, y, isa, 2);
    fwrite(q, 1, values, out);
    if (q2) fwrite(q2, 1, values, out);
    fwrite(d, sizeof(float), blocks, out);
    fwrite(s, sizeof(int32_t), blocks, out);
    fwrite(y, sizeof(float), (size_t)rows * n, out);
    free(packed), free(x), free(q), free(q2), free(d), free(y), free(s);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s INPUT OUTPUT\n", argv[0]);
        return 2;
    }
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    if (!in || !out) return 2;
    const int32_t isa = arbor_best_isa();
    fwrite(&isa, sizeof isa, 1, out);
    int32_t head[6];
    while (fread(head, sizeof(int32_t), 6, in) == 6) run_case(head, in, out, isa);
    fclose(in);
    return fclose(out) == 0 ? 0 : 1;
}
