/* Tandem's weight-only INT8 matrix-vector kernel for CPU decode steps (inference/engine/int8_linear.py loads it).

   y[t, n] = scale[n] * sum_k q[n, k] * x[t, k] (+ bias[n]) for the tokens t of a step, q int8 row-major [N, K]
   with one float32 scale per row (quantization.quantize_per_row), x and y float32. A decode step multiplies one
   token per sequence by every weight once, so it is bound by how fast the weights stream from memory, and int8
   weights are a quarter of float32's bytes. As matvec.c: the rows are read once, in order (one sequential stream,
   prefetched ahead), each row widened to float32 once per GROUP tokens and multiplied with BLOCK tokens while it is
   in L1; more tokens take one more pass per BLOCK (int8_linear.py hands steps of many tokens to a GEMM instead).
   Each token's sums run in the same order whatever else is in its step: outputs are batch-invariant.

   Weight-only: the activations stay float32 (nothing is rounded to int8 but the weights, as they were quantized
   once), so the result is the float product of the dequantized weight, summed in another order: within float32
   rounding of (q * scale) @ x (tests/inference/engine/test_int8_matvec.py).

   No -march: each kernel is compiled for its own instruction set (target attributes) and picked at run time from
   what the CPU reports (kernels.h: AVX-512F, else AVX2 with FMA); tandem_int8_matvec_isa() says which, 0 for
   neither (the engine then keeps fbgemm's dynamic-quantization linear). */
#include "kernels.h"

#define GROUP 4       /* tokens multiplied with one widening of a row's weights (in registers), AVX-512 */
#define GROUP_AVX2 2  /* the same with AVX2's 16 registers */
#define BLOCK 16      /* tokens of one pass over the weights: groups of GROUP over each row while it is in L1 */
/* How far ahead of the multiply the weights are prefetched (into the rows that follow: a matrix's rows are one
   stream). The hardware prefetcher alone left the kernel waiting on memory between rows: on SmolLM2-135M's linears
   at one thread, 1.9x the time of one read of the weights without, 1.3-1.4x with 2-8 KB (4 KB chosen). */
#define PREFETCH_BYTES 4096

TANDEM_ISA_FUNCTIONS(tandem_int8_matvec)

/* Each kernel computes one row for a group of up to GROUP tokens: 16 (AVX-512) or 8 (AVX2) int8 weights are widened
   to float32 once and multiplied with every token of the group. Four accumulators per token hide the FMA latency at
   one token and fix the order of each token's sums whatever the group's size. T is a compile-time constant in each
   instance (the switch below) and the loops over tokens and accumulators are unrolled, so the accumulators stay in
   registers (without the unroll pragmas GCC kept them on the stack). */

/* ---- AVX-512F -------------------------------------------------------------------------------------------------- */

__attribute__((target("avx512f")))
static inline __m512 widen16(const int8_t *q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
}

__attribute__((target("avx512f"), always_inline))
static inline void row_avx512(const int8_t *q, const float *x, int64_t K, int T, float *out) {
    enum { U = 4 };  /* 16 accumulators at T = 4, of 32 registers */
    __m512 acc[U][GROUP];
    _Pragma("GCC unroll 4")
    for (int u = 0; u < U; u++)
        _Pragma("GCC unroll 4")
        for (int t = 0; t < T; t++) acc[u][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 * U <= K; k += 16 * U) {
        _mm_prefetch((const char *)(q + k + PREFETCH_BYTES), _MM_HINT_T0);
        _Pragma("GCC unroll 4")
        for (int u = 0; u < U; u++) {
            __m512 w = widen16(q + k + 16 * u);
            _Pragma("GCC unroll 4")
            for (int t = 0; t < T; t++)
                acc[u][t] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + t * K + k + 16 * u), acc[u][t]);
        }
    }
    for (; k + 16 <= K; k += 16) {
        __m512 w = widen16(q + k);
        _Pragma("GCC unroll 4")
        for (int t = 0; t < T; t++) acc[0][t] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + t * K + k), acc[0][t]);
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < T; t++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]),
                                                     _mm512_add_ps(acc[2][t], acc[3][t])));
        for (int64_t j = k; j < K; j++) s += (float)q[j] * x[t * K + j];
        out[t] = s;
    }
}

__attribute__((target("avx512f")))
static void rows_avx512(const int8_t *q, const float *x, int64_t K, int T, float *out) {
    switch (T) {  /* T constant in each instance: the accumulators become registers */
        case 1: row_avx512(q, x, K, 1, out); break;
        case 2: row_avx512(q, x, K, 2, out); break;
        case 3: row_avx512(q, x, K, 3, out); break;
        default: row_avx512(q, x, K, 4, out); break;
    }
}

/* ---- AVX2 + FMA ------------------------------------------------------------------------------------------------ */

__attribute__((target("avx2,fma")))
static inline __m256 widen8(const int8_t *q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

__attribute__((target("avx2,fma")))
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Two tokens per widening (16 registers: 4 accumulators per token, the row's vector and the input's), so that
   every step size sums in the same order (batch invariance) without spilling accumulators. */
__attribute__((target("avx2,fma"), always_inline))
static inline void row_avx2(const int8_t *q, const float *x, int64_t K, int T, float *out) {
    enum { U = 4 };
    __m256 acc[U][GROUP_AVX2];
    _Pragma("GCC unroll 4")
    for (int u = 0; u < U; u++)
        _Pragma("GCC unroll 2")
        for (int t = 0; t < T; t++) acc[u][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 * U <= K; k += 8 * U) {
        _mm_prefetch((const char *)(q + k + PREFETCH_BYTES), _MM_HINT_T0);
        _Pragma("GCC unroll 4")
        for (int u = 0; u < U; u++) {
            __m256 w = widen8(q + k + 8 * u);
            _Pragma("GCC unroll 2")
            for (int t = 0; t < T; t++)
                acc[u][t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * K + k + 8 * u), acc[u][t]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 w = widen8(q + k);
        _Pragma("GCC unroll 2")
        for (int t = 0; t < T; t++) acc[0][t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * K + k), acc[0][t]);
    }
    _Pragma("GCC unroll 2")
    for (int t = 0; t < T; t++) {
        float s = hsum256(_mm256_add_ps(_mm256_add_ps(acc[0][t], acc[1][t]), _mm256_add_ps(acc[2][t], acc[3][t])));
        for (int64_t j = k; j < K; j++) s += (float)q[j] * x[t * K + j];
        out[t] = s;
    }
}

__attribute__((target("avx2,fma")))
static void rows_avx2(const int8_t *q, const float *x, int64_t K, int T, float *out) {
    if (T == 1) row_avx2(q, x, K, 1, out);
    else row_avx2(q, x, K, 2, out);
}

/* ---- entry point ----------------------------------------------------------------------------------------------- */

/* Each token's input copied into one contiguous [T, K] buffer; with `norm_w`, RMS-normalized on the way as Hugging
   Face's LlamaRMSNorm computes it in float32: x * (1 / sqrt(mean(x^2) + eps)) times the weight. */
static void gather(const float *x, int64_t ldx, int64_t T, int64_t K, const float *norm_w, float eps, float *xf) {
    for (int64_t t = 0; t < T; t++) {
        float *row = xf + t * K;
        memcpy(row, x + t * ldx, sizeof(float) * (size_t)K);
        if (!norm_w) continue;
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) sum += row[k] * row[k];
        float inv = 1.0f / sqrtf(sum / (float)K + eps);
        for (int64_t k = 0; k < K; k++) row[k] = norm_w[k] * (row[k] * inv);
    }
}

/* y[t * ldy + n] for t < T, n < N; x[t * ldx + k]; q[n * ldq + k] int8; scale[n]; bias[n] or NULL; norm_w[k]
   or NULL (then x is RMS-normalized first, with eps); all but q float32. Returns 0, or -1 when the CPU has neither
   instruction set (nothing written), -2 when the input buffer cannot grow, -3 for T < 1. */
int tandem_int8_matvec(const int8_t *q, int64_t ldq, const float *scale, const float *x, int64_t ldx, float *y,
                       int64_t ldy, int64_t T, int64_t N, int64_t K, const float *bias, const float *norm_w,
                       float eps, int num_threads) {
    int which = tandem_int8_matvec_isa();
    if (which == 0) return -1;
    if (T < 1) return -3;
    float *xf = thread_scratch((size_t)(T * K));  /* a plain local: the parallel loop reads this thread's */
    if (!xf) return -2;
    gather(x, ldx, T, K, norm_w, eps, xf);
    int group_size = which == 2 ? GROUP : GROUP_AVX2;
    /* One pass over the weights per BLOCK tokens; static schedule: each thread streams one contiguous band of rows */
    for (int64_t t_start = 0; t_start < T; t_start += BLOCK) {
        int tokens = (int)(T - t_start < BLOCK ? T - t_start : BLOCK);
        const float *xb = xf + t_start * K;
        float *yb = y + t_start * ldy;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && N * K >= 262144)
        for (int64_t n = 0; n < N; n++) {
            float sums[BLOCK];
            const int8_t *row = q + n * ldq;
            for (int t0 = 0; t0 < tokens; t0 += group_size) {
                int group = tokens - t0 < group_size ? tokens - t0 : group_size;
                if (which == 2) rows_avx512(row, xb + t0 * K, K, group, sums + t0);
                else rows_avx2(row, xb + t0 * K, K, group, sums + t0);
            }
            float b = bias ? bias[n] : 0.0f;
            for (int t = 0; t < tokens; t++) yb[t * ldy + n] = scale[n] * sums[t] + b;
        }
    }
    return 0;
}
