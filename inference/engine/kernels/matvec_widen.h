/* matvec.c's inputs: each token's row widened to float32 (and RMS-normalized) once per call, before the tiles
   (included by matvec.c before its entry point). */

/* sum_k row[k]^2 in order, a product and an add each (no target attribute: no fused multiply-add, which a function
   built for AVX-512 would contract them into), for widen and widen_512 alike. */
__attribute__((noinline)) static float sum_of_squares(const float *row, int64_t K) {
    float sum = 0.0f;
    for (int64_t k = 0; k < K; k++) sum += row[k] * row[k];
    return sum;
}

static void widen_512(int dtype, const void *x, int64_t ldx, int64_t T, int64_t K, const void *norm_w, float eps,
                      float *xf);

/* Each token's input widened to float32 once, not per row; with `norm_w`, RMS-normalized on the way as Hugging Face's
   LlamaRMSNorm computes it: float32 x * (1 / sqrt(mean(x^2) + eps)) times the weight; in bfloat16 the normalized
   value is rounded to bfloat16, multiplied by the bfloat16 weight and rounded again, as there. (The sum of squares
   runs in another order than torch's: the same few-ulp difference as the products'.) */
static void widen(int dtype, const void *x, int64_t ldx, int64_t T, int64_t K, const void *norm_w, float eps,
                  float *xf) {
    if (tandem_matvec_isa() == 2 && dtype != DT_F16) {
        widen_512(dtype, x, ldx, T, K, norm_w, eps, xf);
        return;
    }
    for (int64_t t = 0; t < T; t++) {
        float *row = xf + t * K;
        for (int64_t k = 0; k < K; k++) row[k] = load_scalar(dtype, x, t * ldx + k);
        if (!norm_w) continue;
        float inv = 1.0f / sqrtf(sum_of_squares(row, K) / (float)K + eps);
        for (int64_t k = 0; k < K; k++) {
            float w = load_scalar(dtype, norm_w, k);
            row[k] = dtype == DT_F32 ? w * (row[k] * inv)
                                     : bf16_to_f32(f32_to_bf16(w * bf16_to_f32(f32_to_bf16(row[k] * inv))));
        }
    }
}

/* widen on AVX-512F, 16 elements at a time, bit for bit (the products and roundings are the same IEEE operations;
   the sum of squares stays one scalar sum in order): the scalar loops were a visible share of a bfloat16 step of
   many tokens. */
__attribute__((target("avx512f")))
static void widen_512(int dtype, const void *x, int64_t ldx, int64_t T, int64_t K, const void *norm_w, float eps,
                      float *xf) {
    const int bf16 = dtype == DT_BF16;
    for (int64_t t = 0; t < T; t++) {
        float *row = xf + t * K;
        int64_t k = 0;
        if (bf16)
            for (; k + 16 <= K; k += 16) _mm512_storeu_ps(row + k, load_bf16_512((const uint16_t *)x + t * ldx + k));
        else
            for (; k + 16 <= K; k += 16) _mm512_storeu_ps(row + k, _mm512_loadu_ps((const float *)x + t * ldx + k));
        for (; k < K; k++) row[k] = load_scalar(dtype, x, t * ldx + k);
        if (!norm_w) continue;
        float inv = 1.0f / sqrtf(sum_of_squares(row, K) / (float)K + eps);
        const __m512 vinv = _mm512_set1_ps(inv);
        for (k = 0; k + 16 <= K; k += 16) {
            __m512 r = _mm512_mul_ps(_mm512_loadu_ps(row + k), vinv);
            if (bf16)
                r = round_bf16_512(_mm512_mul_ps(load_bf16_512((const uint16_t *)norm_w + k), round_bf16_512(r)));
            else
                r = _mm512_mul_ps(_mm512_loadu_ps((const float *)norm_w + k), r);
            _mm512_storeu_ps(row + k, r);
        }
        for (; k < K; k++) {
            float w = load_scalar(dtype, norm_w, k);
            row[k] = !bf16 ? w * (row[k] * inv) : bf16_to_f32(f32_to_bf16(w * bf16_to_f32(f32_to_bf16(row[k] * inv))));
        }
    }
}
