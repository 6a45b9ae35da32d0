/*
 * The 256-bit tile loops, included once per 256-bit path by quant_dot_avx2.c (a C template). The
 * includer defines YMM_NAME(x) (the path's name for x), YMM_TARGET (its target attribute string)
 * and, before including, the path's dot products:
 *     __m256i YMM_NAME(q4_dot)(const __m256i lo[4], const __m256i hi[4], const int8_t *a)
 *     __m256i YMM_NAME(q4_dot_two)(const __m256i lo[4], const __m256i hi[4], const int8_t *a, const int8_t *a2)
 *     void YMM_NAME(q8_dots)(const uint8_t *rec, int half, const int8_t *a, const int8_t *a2, long stride,
 *                            int nr, __m256i acc[nr])
 * each the exact int32 dot of 8 output rows with one block of activations (the _two form and a2
 * not NULL: 254 dot(w, a) + dot(w, a2), two-term activations); q8_dots for nr rows at once, a
 * row `stride` bytes after the last, so that each weight chunk is prepared once for all of them.
 *
 * 16 registers hold half a tile's work at a time: a record's 64-byte chunk is 16 rows x 4 bytes,
 * bytes 0-31 rows 0-7 (half 0) and bytes 32-63 rows 8-15 (half 1); the fp16 scales split the same way.
 */
#define YMM_INLINE __attribute__((target(YMM_TARGET), always_inline)) static inline

/* out[t, n0 + 8 half + j] for t in [t0, t0 + nr), j < 8 and n0 + 8 half + j < n */
YMM_INLINE void YMM_NAME(store_half)(const __m256 *sum, int t0, int nr, float *out, int n, int first) {
    for (int r = 0; r < nr; r++) {
        float *to = out + (long)(t0 + r) * n + first;
        if (n - first >= 8) {
            _mm256_storeu_ps(to, sum[r]);
        } else {
            float all[8];
            _mm256_storeu_ps(all, sum[r]);
            memcpy(to, all, sizeof(float) * (size_t)(n - first));
        }
    }
}

YMM_INLINE void YMM_NAME(q4_half_rows)(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2,
                                       const float *da, const int32_t *sa, int half, int t0, const int nr, int k,
                                       float *out, int n, int n0) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256 sum[MAX_ROW_BLOCK];
    for (int r = 0; r < nr; r++) sum[r] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = tile + (long)g * Q4_RECORD;
        for (int line = 0; line < Q4_RECORD; line += 64) _mm_prefetch((const char *)(rec + PREFETCH_BYTES + line), _MM_HINT_T0);
        __m256i lo[4], hi[4];
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + c * 64 + half * 32));
            lo[c] = _mm256_and_si256(v, low);
            hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 256 + half * 16)));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 288 + half * 16)));
        for (int r = 0; r < nr; r++) {
            const long at = (long)(t0 + r) * k + (long)g * QK, ag = (long)(t0 + r) * groups + g;
            const __m256i acc = qa2 ? YMM_NAME(q4_dot_two)(lo, hi, qa + at, qa2 + at) : YMM_NAME(q4_dot)(lo, hi, qa + at);
            const float dat = da[ag], mterm = dat * (float)sa[ag];
            sum[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dw, _mm256_set1_ps(dat)), sum[r]);
            sum[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(mterm), sum[r]);
        }
    }
    YMM_NAME(store_half)(sum, t0, nr, out, n, n0 + 8 * half);
}

YMM_INLINE void YMM_NAME(q8_half_rows)(const uint8_t *tile, int groups, const int8_t *qa, const int8_t *qa2,
                                       const float *da, int half, int t0, const int nr, int k, float *out, int n,
                                       int n0) {
    __m256 sum[MAX_ROW_BLOCK];
    for (int r = 0; r < nr; r++) sum[r] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = tile + (long)g * Q8_RECORD;
        for (int line = 0; line < Q8_RECORD; line += 64) _mm_prefetch((const char *)(rec + PREFETCH_BYTES + line), _MM_HINT_T0);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 512 + half * 16)));
        const long at = (long)t0 * k + (long)g * QK;
        __m256i acc[MAX_ROW_BLOCK];
        YMM_NAME(q8_dots)(rec, half, qa + at, qa2 ? qa2 + at : NULL, k, nr, acc);
        for (int r = 0; r < nr; r++) {
            const float dat = da[(long)(t0 + r) * groups + g];
            sum[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_mul_ps(dw, _mm256_set1_ps(dat)), sum[r]);
        }
    }
    YMM_NAME(store_half)(sum, t0, nr, out, n, n0 + 8 * half);
}

/* rows in blocks of MAX_ROW_BLOCK (each block's weights read once), half by half; a half wholly
   past n (the last tile of an n that is not a multiple of 16) is skipped */
__attribute__((target(YMM_TARGET))) static void YMM_NAME(q4_tile)(const uint8_t *tile, int groups, const int8_t *qa,
                                                                 const int8_t *qa2, const float *da, const int32_t *sa,
                                                                 int rows, int k, float *out, int n, int n0) {
    for (int half = 0; half < 2 && n0 + 8 * half < n; half++) {
        int t = 0;
        for (; t + 4 <= rows; t += 4) YMM_NAME(q4_half_rows)(tile, groups, qa, qa2, da, sa, half, t, 4, k, out, n, n0);
        switch (rows - t) {
            case 3: YMM_NAME(q4_half_rows)(tile, groups, qa, qa2, da, sa, half, t, 3, k, out, n, n0); break;
            case 2: YMM_NAME(q4_half_rows)(tile, groups, qa, qa2, da, sa, half, t, 2, k, out, n, n0); break;
            case 1: YMM_NAME(q4_half_rows)(tile, groups, qa, qa2, da, sa, half, t, 1, k, out, n, n0); break;
            default: break;
        }
    }
}

__attribute__((target(YMM_TARGET))) static void YMM_NAME(q8_tile)(const uint8_t *tile, int groups, const int8_t *qa,
                                                                 const int8_t *qa2, const float *da, int rows, int k,
                                                                 float *out, int n, int n0) {
    for (int half = 0; half < 2 && n0 + 8 * half < n; half++) {
        int t = 0;
        for (; t + 4 <= rows; t += 4) YMM_NAME(q8_half_rows)(tile, groups, qa, qa2, da, half, t, 4, k, out, n, n0);
        switch (rows - t) {
            case 3: YMM_NAME(q8_half_rows)(tile, groups, qa, qa2, da, half, t, 3, k, out, n, n0); break;
            case 2: YMM_NAME(q8_half_rows)(tile, groups, qa, qa2, da, half, t, 2, k, out, n, n0); break;
            case 1: YMM_NAME(q8_half_rows)(tile, groups, qa, qa2, da, half, t, 1, k, out, n, n0); break;
            default: break;
        }
    }
}

#undef YMM_INLINE
