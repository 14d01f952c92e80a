/* Tandem's matrix-vector kernel for CPU decode steps (inference/engine/matvec.py builds and loads it).

   y[t, n] = sum_k W[n, k] * x[t, k] (+ bias[n]) for a few tokens t, W row-major [N, K] in float32 or bfloat16, as a
   model file lays a linear's weight out. A decode step multiplies one token per sequence by every weight once, so it
   is bound by how fast the weights stream from memory: the rows are read once, in order, and every token of the
   step is multiplied with a row while it is in L1 (one pass over the weights whatever the number of tokens). One
   thread reads at about the rate a plain sum reads memory; torch's one-token matmul (MKL's) reads at about half of
   it (docs/performance.md).

   Arithmetic: products and sums in float32 (bfloat16 weights and inputs widened exactly), the result rounded once
   to the output dtype (round to nearest even). Sums run in another order than MKL's or oneDNN's, so values are not
   bit-identical to torch's; greedy tokens are (tests/inference/engine/test_matvec.py).

   No -march: each kernel is compiled for its own instruction set (target attributes) and picked at run time from
   what the CPU reports (kernels.h: AVX-512F, else AVX2 with FMA); tandem_matvec_isa() says which, 0 for neither
   (the engine then keeps torch's matmul). */
#include "kernels.h"

TANDEM_ISA_FUNCTIONS(tandem_matvec)

/* How far ahead of the multiply the weights are prefetched, into the rows that follow (a matrix's rows are one
   stream). On an Intel CPU 1 KB read the weights faster than the hardware prefetcher alone, with the AVX-512 and
   more so with the AVX2 kernels, in float32 and bfloat16; 4-8 KB gained less or lost. (An AMD CPU gained nothing
   from a prefetch before.) Values are the same either way.
   Beside it, the same lines PREFETCH_L2_BYTES ahead into L2 only (T1): more misses in flight than L1's fill buffers
   hold. On an Intel CPU with AMX both together read the weights faster in every dtype and kernel; L2 alone at 4 KB
   gained about half of that, L1 alone at 4 KB lost. The figures: docs/performance.md, 'Decode against the bandwidth
   limit'. */
#define PREFETCH_BYTES 1024
#define PREFETCH_L2_BYTES 4096

/* Each kernel computes one row for every token: the row is read from memory once (the rows of a matrix one after
   another are one sequential stream, which the hardware prefetcher follows at a plain sum's rate; four rows side by
   side were slower), and each stretch of it, loaded and widened once, is multiplied with every token of the
   step (one row per token, re-read from L1 and re-widened, was slower already at 3-4 tokens). Four
   accumulators per token hide the FMA latency. */

/* ---- AVX-512F -------------------------------------------------------------------------------------------------- */

__attribute__((target("avx512f")))
static inline __m512 load16_512(int dtype, const void *w, int64_t k) {
    if (dtype == DT_F32) return _mm512_loadu_ps((const float *)w + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* `nt` tokens (at most 4) against one row: each 64-element stretch of the row is loaded (and widened) once and
   multiplied with every token's input; per token the same four accumulators and summation order as one token alone,
   so a token's value does not depend on the others in its step. always_inline: each call site has a constant nt and
   the loops over tokens unroll into registers (4 tokens x 4 accumulators + 4 weights of 32 zmm). */
__attribute__((target("avx512f"), always_inline))
static inline void dots_avx512(int dtype, const void *w, const float *x, int64_t K, int nt, float *out) {
    __m512 a[4][4];
    for (int t = 0; t < nt; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm512_setzero_ps();
    int64_t k = 0;
    const size_t size = dtype == DT_F32 ? 4 : 2;
    for (; k + 64 <= K; k += 64) {
        const char *ahead = (const char *)w + k * size + PREFETCH_BYTES;
        for (size_t line = 0; line < 64 * size; line += 64) {
            _mm_prefetch(ahead + line, _MM_HINT_T0);
            _mm_prefetch(ahead + (PREFETCH_L2_BYTES - PREFETCH_BYTES) + line, _MM_HINT_T1);
        }
        __m512 w0 = load16_512(dtype, w, k), w1 = load16_512(dtype, w, k + 16);
        __m512 w2 = load16_512(dtype, w, k + 32), w3 = load16_512(dtype, w, k + 48);
        for (int t = 0; t < nt; t++) {
            const float *xt = x + t * K + k;
            a[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), a[t][0]);
            a[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), a[t][1]);
            a[t][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xt + 32), a[t][2]);
            a[t][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xt + 48), a[t][3]);
        }
    }
    for (; k + 16 <= K; k += 16) {
        __m512 w0 = load16_512(dtype, w, k);
        for (int t = 0; t < nt; t++) a[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * K + k), a[t][0]);
    }
    for (int t = 0; t < nt; t++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[t][0], a[t][1]), _mm512_add_ps(a[t][2], a[t][3])));
        for (int64_t j = k; j < K; j++) s += load_scalar(dtype, w, j) * x[t * K + j];
        out[t] = s;
    }
}

__attribute__((target("avx512f")))
static void row_avx512(int dtype, const void *w, const float *x, int64_t K, int64_t T, float *out) {
    for (int64_t t = 0; t < T; t += 4) {
        switch (T - t >= 4 ? 4 : (int)(T - t)) {
            case 4: dots_avx512(dtype, w, x + t * K, K, 4, out + t); break;
            case 3: dots_avx512(dtype, w, x + t * K, K, 3, out + t); break;
            case 2: dots_avx512(dtype, w, x + t * K, K, 2, out + t); break;
            default: dots_avx512(dtype, w, x + t * K, K, 1, out + t);
        }
    }
}

/* ---- AVX2 + FMA ------------------------------------------------------------------------------------------------ */

__attribute__((target("avx2,fma")))
static inline __m256 load8_256(int dtype, const void *w, int64_t k) {
    if (dtype == DT_F32) return _mm256_loadu_ps((const float *)w + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* As dots_avx512, two tokens at a time (2 x 4 accumulators + 4 weights of 16 ymm). */
__attribute__((target("avx2,fma"), always_inline))
static inline void dots_avx2(int dtype, const void *w, const float *x, int64_t K, int nt, float *out) {
    __m256 a[2][4];
    for (int t = 0; t < nt; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm256_setzero_ps();
    int64_t k = 0;
    const size_t size = dtype == DT_F32 ? 4 : 2;
    for (; k + 32 <= K; k += 32) {
        const char *ahead = (const char *)w + k * size + PREFETCH_BYTES;
        for (size_t line = 0; line < 32 * size; line += 64) {
            _mm_prefetch(ahead + line, _MM_HINT_T0);
            _mm_prefetch(ahead + (PREFETCH_L2_BYTES - PREFETCH_BYTES) + line, _MM_HINT_T1);
        }
        __m256 w0 = load8_256(dtype, w, k), w1 = load8_256(dtype, w, k + 8);
        __m256 w2 = load8_256(dtype, w, k + 16), w3 = load8_256(dtype, w, k + 24);
        for (int t = 0; t < nt; t++) {
            const float *xt = x + t * K + k;
            a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t][0]);
            a[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), a[t][1]);
            a[t][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), a[t][2]);
            a[t][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), a[t][3]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 w0 = load8_256(dtype, w, k);
        for (int t = 0; t < nt; t++) a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * K + k), a[t][0]);
    }
    for (int t = 0; t < nt; t++) {
        float r = hsum_avx2(_mm256_add_ps(_mm256_add_ps(a[t][0], a[t][1]), _mm256_add_ps(a[t][2], a[t][3])));
        for (int64_t j = k; j < K; j++) r += load_scalar(dtype, w, j) * x[t * K + j];
        out[t] = r;
    }
}

__attribute__((target("avx2,fma")))
static void row_avx2(int dtype, const void *w, const float *x, int64_t K, int64_t T, float *out) {
    for (int64_t t = 0; t < T; t += 2) {
        if (T - t >= 2) dots_avx2(dtype, w, x + t * K, K, 2, out + t);
        else dots_avx2(dtype, w, x + t * K, K, 1, out + t);
    }
}

/* ---- AVX2 + FMA, steps of more than 4 tokens ------------------------------------------------------------------- */

/* A batched decode step (5-32 sequences) is bound by arithmetic, not by the weights' stream: the row-at-a-time kernel
   above re-reads each row from L1 per pair of tokens, and oneDNN's GEMM (which reorders the weights on each call)
   ran a small model's linears at about half of a large float32 matmul's rate on an AVX2-only CPU. Here a tile of 3
   rows x 4 tokens keeps 12 accumulators in registers (3 weights + 1 input + 12 sums of the 16 ymm), and while the
   first tokens' tile runs, the next 3 rows are prefetched: faster than oneDNN's GEMM, the more so the fewer the
   tokens. The AVX-512 tiles' prefetch spread over every pass (below) lost here, on an AVX2-only CPU at every batch
   size, against the next rows into L1 during the first pass (spread into L2 or L1 alike). The figures:
   docs/performance.md, 'Batched decode'.

   Each (row, token) sums in one accumulator, k in steps of 8 in order, whatever the tile: a token's value does not
   depend on the others in its step (but differs by a few ulp from the 1-4 token kernel's order above). */
/* nr rows (at most 3, `row_bytes` apart) x nt tokens (at most 4); with `prefetch`, the 3 rows after these (past a
   matrix's last rows that reads nothing: a prefetch never faults). */
__attribute__((target("avx2,fma"), always_inline))
static inline void tile_avx2(int dtype, const void *w, size_t row_bytes, const float *x, int64_t K, int nr, int nt,
                             int prefetch, float out[3][4]) {
    __m256 a[3][4];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) a[r][t] = _mm256_setzero_ps();
    const size_t size = dtype == DT_F32 ? 4 : 2;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        if (prefetch && (k & 15) == 0)  /* one line of each next row per 16 elements (64 bytes of float32) */
            for (int r = 0; r < 3; r++) _mm_prefetch((const char *)w + (3 + r) * row_bytes + k * size, _MM_HINT_T0);
        __m256 wv[3];
        for (int r = 0; r < nr; r++) wv[r] = load8_256(dtype, (const char *)w + r * row_bytes, k);
        for (int t = 0; t < nt; t++) {
            __m256 xv = _mm256_loadu_ps(x + t * K + k);
            for (int r = 0; r < nr; r++) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
        }
    }
    for (int r = 0; r < nr; r++) {
        const void *wr = (const char *)w + r * row_bytes;
        for (int t = 0; t < nt; t++) {
            float s = hsum_avx2(a[r][t]);
            for (int64_t j = k; j < K; j++) s += load_scalar(dtype, wr, j) * x[t * K + j];
            out[r][t] = s;
        }
    }
}

/* TILE(NR, nt) with nt (1-4) a constant at each call site, so that each tile's loops unroll into registers. */
#define TILE_TOKENS(TILE, NR)                                           \
    switch (nt) {                                                       \
        case 4: TILE(NR, 4); break;                                     \
        case 3: TILE(NR, 3); break;                                     \
        case 2: TILE(NR, 2); break;                                     \
        default: TILE(NR, 1);                                           \
    }
#define TILE_AVX2(NR, NT) tile_avx2(dtype, w, row_bytes, xf + t0 * K, K, NR, NT, t0 == 0, v)
#define TILE_AVX2_ROWS(NR) TILE_TOKENS(TILE_AVX2, NR)

/* Rows n .. n + nr - 1 (w is row n) for every token: y[t * ldy + n + r] (+ bias[n + r]). */
__attribute__((target("avx2,fma")))
static void rows_avx2(int dtype, const void *w, size_t row_bytes, const float *xf, int64_t K, int64_t T, int nr,
                      void *y, int64_t ldy, int64_t n, const void *bias) {
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
        int nt = T - t0 < 4 ? (int)(T - t0) : 4;
        float v[3][4];
        if (nr == 3) { TILE_AVX2_ROWS(3) }
        else if (nr == 2) { TILE_AVX2_ROWS(2) }
        else { TILE_AVX2_ROWS(1) }
        for (int r = 0; r < nr; r++) {
            float b = bias ? load_scalar(dtype, bias, n + r) : 0.0f;
            for (int t = 0; t < nt; t++) store_scalar(dtype, y, (t0 + t) * ldy + n + r, v[r][t] + b);
        }
    }
}

/* ---- AVX-512F, steps of more than 4 tokens --------------------------------------------------------------------- */

/* As the AVX2 tiles above, with 32 zmm registers: 6 rows x 4 tokens, 24 accumulators (6 weights + 1 input + 24 sums of
   32). The next 6 rows are prefetched into L2 a few lines at each step of every pass over the step's tokens (pass
   `pass` of `passes`), so that their read overlaps the later passes' arithmetic, not the first pass's alone: faster, on
   an Intel CPU with AMX in float32 at every batch size, than all of them into L1 during the first pass. Each (row,
   token) sums in one accumulator, k in steps of 16 in order: a token's value does not depend on the others. */
__attribute__((target("avx512f"), always_inline))
static inline void tile_avx512(int dtype, const void *w, size_t row_bytes, const float *x, int64_t K, int nr, int nt,
                               int pass, int passes, float out[6][4]) {
    __m512 a[6][4];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) a[r][t] = _mm512_setzero_ps();
    const size_t size = dtype == DT_F32 ? 4 : 2;
    /* the next 6 rows' lines (`lines` in all), `per_step` of them at each step of k of every pass */
    const int64_t steps = K / 16, lines = 6 * (((int64_t)(K * size) + 63) / 64);
    const int64_t per_step = steps > 0 ? (lines + passes * steps - 1) / (passes * steps) : 0;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const int64_t first = (pass * steps + k / 16) * per_step;
        for (int64_t j = first; j < first + per_step && j < lines; j++)
            _mm_prefetch((const char *)w + (6 + j % 6) * row_bytes + (j / 6) * 64, _MM_HINT_T1);
        __m512 wv[6];
        for (int r = 0; r < nr; r++) wv[r] = load16_512(dtype, (const char *)w + r * row_bytes, k);
        for (int t = 0; t < nt; t++) {
            __m512 xv = _mm512_loadu_ps(x + t * K + k);
            for (int r = 0; r < nr; r++) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
        }
    }
    for (int r = 0; r < nr; r++) {
        const void *wr = (const char *)w + r * row_bytes;
        for (int t = 0; t < nt; t++) {
            float s = _mm512_reduce_add_ps(a[r][t]);
            for (int64_t j = k; j < K; j++) s += load_scalar(dtype, wr, j) * x[t * K + j];
            out[r][t] = s;
        }
    }
}

#define TILE_AVX512(NR, NT) tile_avx512(dtype, w, row_bytes, xf + t0 * K, K, NR, NT, (int)(t0 / 4), (int)((T + 3) / 4), v)
#define TILE_AVX512_ROWS(NR) TILE_TOKENS(TILE_AVX512, NR)

/* The body of rows_avx512 and rows_bf16dot: for each group of up to 4 tokens (nt), the tile of nr rows (ROWS(nr):
   up to 6), then each output plus its bias stored in DTYPE. */
#define SIX_ROW_TILES(ROWS, DTYPE)                                                                           \
    for (int64_t t0 = 0; t0 < T; t0 += 4) {                                                                  \
        int nt = T - t0 < 4 ? (int)(T - t0) : 4;                                                             \
        float v[6][4];                                                                                       \
        switch (nr) {                                                                                        \
            case 6: ROWS(6) break;                                                                           \
            case 5: ROWS(5) break;                                                                           \
            case 4: ROWS(4) break;                                                                           \
            case 3: ROWS(3) break;                                                                           \
            case 2: ROWS(2) break;                                                                           \
            default: ROWS(1)                                                                                 \
        }                                                                                                    \
        for (int r = 0; r < nr; r++) {                                                                       \
            float b = bias ? load_scalar(DTYPE, bias, n + r) : 0.0f;                                         \
            for (int t = 0; t < nt; t++) store_scalar(DTYPE, y, (t0 + t) * ldy + n + r, v[r][t] + b);        \
        }                                                                                                    \
    }

/* Rows n .. n + nr - 1 (w is row n) for every token: y[t * ldy + n + r] (+ bias[n + r]). */
__attribute__((target("avx512f")))
static void rows_avx512(int dtype, const void *w, size_t row_bytes, const float *xf, int64_t K, int64_t T, int nr,
                        void *y, int64_t ldy, int64_t n, const void *bias) {
    SIX_ROW_TILES(TILE_AVX512_ROWS, dtype)
}

#include "matvec_bf16dot.h"

/* ---- entry point ----------------------------------------------------------------------------------------------- */

#include "matvec_widen.h"

/* y[t * ldy + n] for t < T, n < N; x[t * ldx + k]; W[n * ldw + k]; bias[n] or NULL; norm_w[k] or NULL (then x is
   RMS-normalized first, with eps); x, y, bias, norm_w in W's dtype. Returns 0, or -1 when the CPU has neither
   instruction set (nothing written), -2 when the input buffer cannot grow. */
int tandem_matvec(int dtype, const void *W, int64_t ldw, const void *x, int64_t ldx, void *y, int64_t ldy,
                  int64_t T, int64_t N, int64_t K, const void *bias, const void *norm_w, float eps,
                  int num_threads) {
    int which = tandem_matvec_isa();
    if (which == 0) return -1;
    const int bf16_tiles = which == 2 && dtype == DT_BF16 && tandem_matvec_bf16_dot(-1);
    /* a plain local: the parallel loop reads this thread's; with the AVX512-BF16 tiles, the bfloat16 copy after it */
    float *xf = thread_scratch((size_t)(T * K) + (bf16_tiles ? (size_t)(T * K + 1) / 2 : 0));
    if (!xf) return -2;
    widen(dtype, x, ldx, T, K, norm_w, eps, xf);
    size_t row_bytes = (size_t)ldw * (dtype == DT_F32 ? 4 : 2);
    if (bf16_tiles) {  /* AVX512-BF16: tiles of 6 rows over the inputs narrowed back to bfloat16 */
        uint16_t *xb = (uint16_t *)(xf + T * K);
        for (int64_t i = 0; i < T * K; i++) {  /* exact: each value is a bfloat16's, widened */
            uint32_t u;
            memcpy(&u, xf + i, 4);
            xb[i] = (uint16_t)(u >> 16);
        }
        int64_t num_blocks = (N + 5) / 6;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && N * K >= 65536)
        for (int64_t block = 0; block < num_blocks; block++) {
            int64_t n = block * 6;
            int nr = N - n < 6 ? (int)(N - n) : 6;
            rows_bf16dot((const char *)W + (size_t)n * row_bytes, row_bytes, xb, K, T, nr, y, ldy, n, bias);
        }
        return 0;
    }
    if (which == 2 && T > 4) {  /* AVX-512: tiles of 6 rows (the engine sends up to WIDE_MAX_TOKENS tokens here) */
        int64_t num_blocks = (N + 5) / 6;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && N * K >= 65536)
        for (int64_t block = 0; block < num_blocks; block++) {
            int64_t n = block * 6;
            int nr = N - n < 6 ? (int)(N - n) : 6;
            rows_avx512(dtype, (const char *)W + (size_t)n * row_bytes, row_bytes, xf, K, T, nr, y, ldy, n, bias);
        }
        return 0;
    }
    if (which == 1 && T > 4) {  /* AVX2: tiles of 3 rows (the engine sends up to WIDE_MAX_TOKENS tokens here) */
        int64_t num_blocks = (N + 2) / 3;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && N * K >= 65536)
        for (int64_t block = 0; block < num_blocks; block++) {
            int64_t n = block * 3;
            int nr = N - n < 3 ? (int)(N - n) : 3;
            rows_avx2(dtype, (const char *)W + (size_t)n * row_bytes, row_bytes, xf, K, T, nr, y, ldy, n, bias);
        }
        return 0;
    }
    /* static schedule: each thread streams one contiguous band of rows */
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && N * K >= 65536)
    for (int64_t n = 0; n < N; n++) {
        const void *w = (const char *)W + (size_t)n * row_bytes;
        float b = bias ? load_scalar(dtype, bias, n) : 0.0f;
        for (int64_t t0 = 0; t0 < T; t0 += 4) {  /* the engine sends at most 4 (MAX_TOKENS) here: one pass */
            int64_t nt = T - t0 < 4 ? T - t0 : 4;
            float v[4];
            if (which == 2) row_avx512(dtype, w, xf + t0 * K, K, nt, v);
            else row_avx2(dtype, w, xf + t0 * K, K, nt, v);
            for (int64_t t = 0; t < nt; t++) store_scalar(dtype, y, (t0 + t) * ldy + n, v[t] + b);
        }
    }
    return 0;
}
