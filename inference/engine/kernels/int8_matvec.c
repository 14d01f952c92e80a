/* Tandem's INT8 matrix-vector kernel for CPU decode steps (inference/engine/int8_linear.py loads it): int8 weights,
   int16 activations, exact integer sums.

   y[t, n] = scale[n] * xscale[t] * sum_k q[n, k] * xq[t, k] (+ bias[n]) for the tokens t of a step, q int8 row-major
   [N, K] with one float32 scale per row (quantization.quantize_per_row), x and y float32. Each token's input is
   rounded once per call to int16 with its own scale: xscale[t] = max_k |x[t, k]| / 32767, xq = x / xscale rounded
   to nearest (even), so |xq| <= 32767 and a token's rounding depends on that token alone. The error this adds is
   at most half a step of 1/32767 of the token's largest activation; on SmolLM2 it left the next-token
   distributions as close to float32's as the float activations did (KL 0.00462 against 0.00459: int8_linear.py).

   A decode step multiplies one token per sequence by every weight once, so a single stream is bound by how fast the
   weights stream from memory (int8 is a quarter of float32's bytes), and a step of many sequences by the multiplies.
   The rows are read once, in order (one sequential stream, prefetched ahead), ROWS rows at a time, each 16 weights
   sign-extended to int16 once per GROUP tokens (_mm256_cvtepi8_epi16) and multiplied with every token of the group by
   _mm256_madd_epi16: 16 products summed pairwise into 8 int32 lanes, twice the multiplies per instruction of a float32
   FMA; more tokens take one more pass per BLOCK (int8_linear.py hands steps of many tokens to a GEMM instead).

   Exact: the int32 lanes are summed into int64 every CHUNK weights (the overflow bound below), so a (row, token)'s
   sum is the exact integer whatever the step's size or the grouping, and the one float rounding after it is the
   same: outputs are batch-invariant and the result is the float32 rounding of the float64 product of the
   dequantized weights with the int16-rounded activations (tests/inference/engine/test_int8_matvec.py).

   One instruction set: AVX2 (the integer multiply-add; AVX-512 CPUs run it too, so every CPU computes the same
   values), and where the CPU has AVX512-VNNI, steps of 4 tokens or more fuse each multiply-add and add into one
   vpdpwssd (the same wrapping int32 sums: the same values; dot_rows_vnni). No -march: the kernel is compiled by
   target attributes and runs where the CPU reports AVX2 with FMA (kernels.h's check; FMA is not used, but it keeps
   the check the other kernels use); tandem_int8_matvec_isa() says 1 (avx2+fma) there, 0 elsewhere (the engine then
   keeps fbgemm's linear). */
#include "kernels.h"

/* Rows multiplied at once (each token's int16 vector loaded once for all), for passes of at least GROUP tokens; fewer
   tokens take one row at a time, which streamed the weights faster (at one token three rows at once were slower
   than one). Any blocking gives the same exact sums. */
#define ROWS 3
#define GROUP 4      /* tokens multiplied with one widening of the rows' weights: ROWS * GROUP int32 accumulators */
#define BLOCK 16     /* tokens of one pass over the weights: groups of GROUP over each band of rows while it is in L1 */
/* Weights per int32 accumulation before its lanes are summed into int64. A lane gains at most 2 * 128 * 32767 per
   madd (two products of |q| <= 128 and |xq| <= 32767) and one madd per 16 weights: 4096 weights give 256 madds,
   at most 256 * 8388352 = 2147418112 <= INT32_MAX = 2147483647, so no K overflows. */
#define CHUNK 4096
_Static_assert((int64_t)(CHUNK / 16) * 2 * 128 * 32767 <= INT32_MAX, "int32 accumulators may overflow");
/* How far ahead of the multiply the weights are prefetched (into the rows that follow: a matrix's rows are one
   stream). The hardware prefetcher alone left the float kernel waiting on memory between rows: a step took far
   longer than one read of the weights without, much less with a distance of 2-8 KB (4 KB chosen). Beside it, twice
   as far ahead into L2 only (T1), as matvec.c does: a little faster on a CPU with AMX, at one token and at 16. Both
   once per 64-byte line (each line was prefetched twice, once per 32 weights): clearly faster on an older AVX2-only
   CPU, where the kernel is bound by its instructions, not by memory; any distance from 1 to 8 KB did as well there.
   The figures: docs/performance.md, 'INT8 kernels by CPU and role'. */
#define PREFETCH_BYTES 4096

/* kernels.h's TANDEM_ISA_FUNCTIONS, capped at AVX2: the only set this kernel has. */
static int isa = -1;
int tandem_int8_matvec_isa(void) {
    if (isa < 0) isa = detected_isa() ? 1 : 0;
    return isa;
}
int tandem_int8_matvec_cap_isa(int max) {
    int found = detected_isa() ? 1 : 0;
    isa = found < max ? found : max;
    return isa;
}

/* ---- the activations: float32 to int16 -------------------------------------------------------------------------- */

/* xq[k] = x[k] / (amax / 32767) rounded to nearest even, and returns amax / 32767 (the token's scale): computed as
   x[k] * (32767 / amax) in float32, as the tests' reference does. NaN for a non-finite input (its outputs are NaN),
   0 for an all-zero one (or one whose largest activation is under TINY). */
#define TINY 1e-30f
__attribute__((target("avx2,fma")))
static float quantize_token(const float *x, int64_t K, int16_t *xq) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, m);
    int nan = _mm256_movemask_ps(unordered) != 0;
    for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;
    for (; k < K; k++) {
        nan |= x[k] != x[k];
        amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
    }
    /* Below TINY, 32767 / amax would overflow to infinity (and 0 * inf is NaN): such a token is taken as zero. */
    if (nan || amax == INFINITY || amax < TINY) {
        memset(xq, 0, sizeof(int16_t) * (size_t)K);
        return amax < TINY && !nan ? 0.0f : NAN;
    }
    float inv = 32767.0f / amax;
    const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(32767.0f), lo = _mm256_set1_ps(-32767.0f);
    for (k = 0; k + 16 <= K; k += 16) {  /* cvtps rounds to nearest even (the default MXCSR mode) */
        __m256i a = _mm256_cvtps_epi32(
            _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(x + k), vinv))));
        __m256i b = _mm256_cvtps_epi32(
            _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv))));
        /* packs works per 128-bit lane: a0 b0 a1 b1 -> a0 a1 b0 b1 */
        _mm256_storeu_si256((__m256i *)(xq + k), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
    }
    for (; k < K; k++) {
        float v = nearbyintf(x[k] * inv);
        xq[k] = (int16_t)(v > 32767.0f ? 32767.0f : v < -32767.0f ? -32767.0f : v);
    }
    return amax / 32767.0f;
}

/* Each token's input (RMS-normalized on the way with `norm_w`, as Hugging Face's LlamaRMSNorm computes it in
   float32: x * (1 / sqrt(mean(x^2) + eps)) times the weight) rounded to int16 into one contiguous [T, K] buffer,
   with its scale; `row` is one float row of scratch. */
static void gather(const float *x, int64_t ldx, int64_t T, int64_t K, const float *norm_w, float eps, float *row,
                   float *xscale, int16_t *xq) {
    for (int64_t t = 0; t < T; t++) {
        const float *src = x + t * ldx;
        if (norm_w) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++) sum += src[k] * src[k];
            float inv = 1.0f / sqrtf(sum / (float)K + eps);
            for (int64_t k = 0; k < K; k++) row[k] = norm_w[k] * (src[k] * inv);
            src = row;
        }
        xscale[t] = quantize_token(src, K, xq + t * K);
    }
}

/* ---- the multiply: AVX2 --------------------------------------------------------------------------------------- */

__attribute__((target("avx2,fma")))
static inline int64_t hsum_epi32(__m256i v) {  /* in int64: eight int32 lanes can exceed int32 together */
    __m256i w = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                 _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    return _mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1);
}

/* sums[r * GROUP + t] = sum_k q[r * ldq + k] * xq[t * K + k], exactly, for R rows and T tokens. R and T are
   compile-time constants in each instance (the switches below) and the loops over them are unrolled, so the R * T
   accumulators stay in registers (AVX2's 16 ymm: 12 accumulators, 3 rows' weights, a product, some spilled to the
   stack at four tokens; the tokens' vectors are memory operands of the multiply-add). ACCUMULATE(acc, w, v) adds
   the pairwise products of w and v to acc's int32 lanes: _mm256_madd_epi16 then _mm256_add_epi32 on AVX2, one
   vpdpwssd where the CPU has AVX512-VNNI (dot_rows_vnni: the same wrapping int32 sums, so the same exact values,
   with 32 ymm registers and no spill). */
#define DOT_BODY(ACCUMULATE)                                                                                        \
    int64_t k16 = K & ~(int64_t)15;                                                                                 \
    _Pragma("GCC unroll 4")                                                                                         \
    for (int r = 0; r < R; r++)                                                                                     \
        _Pragma("GCC unroll 8")                                                                                     \
        for (int t = 0; t < T; t++) sums[r * GROUP + t] = 0;                                                        \
    for (int64_t start = 0; start < k16; start += CHUNK) {                                                          \
        int64_t end = start + CHUNK < k16 ? start + CHUNK : k16;                                                    \
        __m256i acc[ROWS][GROUP];                                                                                   \
        _Pragma("GCC unroll 4")                                                                                     \
        for (int r = 0; r < R; r++)                                                                                 \
            _Pragma("GCC unroll 8")                                                                                 \
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_si256();                                         \
        int64_t k = start;                                                                                          \
        for (; k + 64 <= end; k += 64) {  /* one cache line of each row: prefetched once */                        \
            _Pragma("GCC unroll 4")                                                                                 \
            for (int r = 0; r < R; r++) {                                                                           \
                _mm_prefetch((const char *)(q + r * ldq + k + PREFETCH_BYTES), _MM_HINT_T0);                        \
                _mm_prefetch((const char *)(q + r * ldq + k + 2 * PREFETCH_BYTES), _MM_HINT_T1);                    \
            }                                                                                                       \
            _Pragma("GCC unroll 4")                                                                                 \
            for (int h = 0; h < 64; h += 16) {                                                                      \
                __m256i w[ROWS];                                                                                    \
                _Pragma("GCC unroll 4")                                                                             \
                for (int r = 0; r < R; r++)                                                                         \
                    w[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + r * ldq + k + h)));           \
                _Pragma("GCC unroll 8")                                                                             \
                for (int t = 0; t < T; t++) {                                                                       \
                    __m256i v = _mm256_loadu_si256((const __m256i *)(xq + t * K + k + h));                          \
                    _Pragma("GCC unroll 4")                                                                         \
                    for (int r = 0; r < R; r++) acc[r][t] = ACCUMULATE(acc[r][t], w[r], v);                         \
                }                                                                                                   \
            }                                                                                                       \
        }                                                                                                           \
        for (; k < end; k += 16) {                                                                                  \
            __m256i w[ROWS];                                                                                        \
            _Pragma("GCC unroll 4")                                                                                 \
            for (int r = 0; r < R; r++)                                                                             \
                w[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + r * ldq + k)));                   \
            _Pragma("GCC unroll 8")                                                                                 \
            for (int t = 0; t < T; t++) {                                                                           \
                __m256i v = _mm256_loadu_si256((const __m256i *)(xq + t * K + k));                                  \
                _Pragma("GCC unroll 4")                                                                             \
                for (int r = 0; r < R; r++) acc[r][t] = ACCUMULATE(acc[r][t], w[r], v);                             \
            }                                                                                                       \
        }                                                                                                           \
        _Pragma("GCC unroll 4")                                                                                     \
        for (int r = 0; r < R; r++)                                                                                 \
            _Pragma("GCC unroll 8")                                                                                 \
            for (int t = 0; t < T; t++) sums[r * GROUP + t] += hsum_epi32(acc[r][t]);                              \
    }                                                                                                               \
    for (int64_t k = k16; k < K; k++)                                                                               \
        for (int r = 0; r < R; r++)                                                                                 \
            for (int t = 0; t < T; t++) sums[r * GROUP + t] += (int32_t)q[r * ldq + k] * xq[t * K + k];

#define MADD_ADD(acc, w, v) _mm256_add_epi32((acc), _mm256_madd_epi16((w), (v)))
#define DPWSSD(acc, w, v) _mm256_dpwssd_epi32((acc), (w), (v))

__attribute__((target("avx2,fma"), always_inline))
static inline void dot(const int8_t *q, int64_t ldq, const int16_t *xq, int64_t K, int R, int T, int64_t *sums) {
    DOT_BODY(MADD_ADD)
}

#define VNNI_TARGET "avx2,fma,avx512f,avx512vl,avx512vnni"
__attribute__((target(VNNI_TARGET), always_inline))
static inline void dot_vnni(const int8_t *q, int64_t ldq, const int16_t *xq, int64_t K, int R, int T,
                            int64_t *sums) {
    DOT_BODY(DPWSSD)
}

/* R and T constant in each instance: the accumulators become registers */
#define DOT_TOKENS(DOT, R_)                                                                         \
    switch (T) {                                                                                    \
        case 1: DOT(q, ldq, xq, K, R_, 1, sums); break;                                             \
        case 2: DOT(q, ldq, xq, K, R_, 2, sums); break;                                             \
        case 3: DOT(q, ldq, xq, K, R_, 3, sums); break;                                             \
        default: DOT(q, ldq, xq, K, R_, GROUP, sums); break;                                        \
    }
#define DOT_ROWS(DOT)                                                                               \
    if (R == ROWS) {                                                                                \
        DOT_TOKENS(DOT, ROWS)                                                                       \
    } else {                                                                                        \
        for (int r = 0; r < R; r++, q += ldq, sums += GROUP) DOT_TOKENS(DOT, 1)                     \
    }

__attribute__((target("avx2,fma")))
static void dot_rows(const int8_t *q, int64_t ldq, const int16_t *xq, int64_t K, int R, int T, int64_t *sums) {
    DOT_ROWS(dot)
}

__attribute__((target(VNNI_TARGET)))
static void dot_rows_vnni(const int8_t *q, int64_t ldq, const int16_t *xq, int64_t K, int R, int T, int64_t *sums) {
    DOT_ROWS(dot_vnni)
}

/* AVX512-VNNI's multiply-add where the CPU has it, unless switched off (tests and benches compare the two: the same
   values), for ROWS rows at once (steps of GROUP tokens or more). One row at a time (fewer tokens) keeps AVX2's:
   there each accumulator is one chain of vpdpwssd, bound by its latency, where madd's add is one cycle (a
   single-stream step is slower with VNNI's than with AVX2's). Returns whether it is used now. */
static int vnni_off = 0, cpu_vnni = -1;
int tandem_int8_matvec_vnni(int on) {
    if (cpu_vnni < 0)
        cpu_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512vnni");
    if (on >= 0) vnni_off = !on;
    return cpu_vnni && !vnni_off;
}

/* ---- entry point ----------------------------------------------------------------------------------------------- */

/* y[t * ldy + n] for t < T, n < N; x[t * ldx + k]; q[n * ldq + k] int8; scale[n]; bias[n] or NULL; norm_w[k]
   or NULL (then x is RMS-normalized first, with eps); all but q float32. Returns 0, or -1 when the CPU lacks AVX2
   with FMA (nothing written), -2 when the input buffer cannot grow, -3 for T < 1. */
int tandem_int8_matvec(const int8_t *q, int64_t ldq, const float *scale, const float *x, int64_t ldx, float *y,
                       int64_t ldy, int64_t T, int64_t N, int64_t K, const float *bias, const float *norm_w,
                       float eps, int num_threads) {
    if (tandem_int8_matvec_isa() == 0) return -1;
    if (T < 1) return -3;
    /* scratch, in floats: one float row, T scales, then the [T, K] int16 tokens */
    float *scratch = thread_scratch((size_t)(K + T + (T * K + 1) / 2));  /* plain locals: the loop reads them */
    if (!scratch) return -2;
    float *xscale = scratch + K;
    int16_t *xq = (int16_t *)(scratch + K + T);
    gather(x, ldx, T, K, norm_w, eps, scratch, xscale, xq);
    const int vnni = tandem_int8_matvec_vnni(-1);
    int64_t num_bands = (N + ROWS - 1) / ROWS;
    /* One pass over the weights per BLOCK tokens; static schedule: each thread streams one contiguous band of rows */
    for (int64_t t_start = 0; t_start < T; t_start += BLOCK) {
        int tokens = (int)(T - t_start < BLOCK ? T - t_start : BLOCK);
        const int16_t *xb = xq + t_start * K;
        const float *sb = xscale + t_start;
        float *yb = y + t_start * ldy;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && N * K >= 262144)
        for (int64_t band = 0; band < num_bands; band++) {
            int64_t n = band * ROWS;
            int rows = N - n < ROWS ? (int)(N - n) : ROWS;
            int at_once = tokens < GROUP ? 1 : rows;  /* dot_rows takes ROWS rows together, fewer one by one */
            int64_t sums[ROWS][BLOCK], group_sums[ROWS * GROUP];
            for (int t0 = 0; t0 < tokens; t0 += GROUP) {
                int group = tokens - t0 < GROUP ? tokens - t0 : GROUP;
                for (int r0 = 0; r0 < rows; r0 += at_once) {
                    (vnni && at_once > 1 ? dot_rows_vnni : dot_rows)(q + (n + r0) * ldq, ldq, xb + t0 * K, K,
                                                                     at_once, group, group_sums);
                    for (int r = 0; r < at_once; r++)
                        for (int t = 0; t < group; t++) sums[r0 + r][t0 + t] = group_sums[r * GROUP + t];
                }
            }
            for (int r = 0; r < rows; r++) {
                float b = bias ? bias[n + r] : 0.0f;
                for (int t = 0; t < tokens; t++) yb[t * ldy + n + r] = (float)sums[r][t] * (scale[n + r] * sb[t]) + b;
            }
        }
    }
    return 0;
}
