/* matvec.c's AVX512-BF16 tiles (included there after the AVX-512F tiles, whose TILE_TOKENS and SIX_ROW_TILES they
   use; native.py's build key covers the headers beside the source). */
/* ---- AVX512-BF16, every bfloat16 step -------------------------------------------------------------------------- */

/* Every bfloat16 step on a CPU with AVX512-BF16 (recent AMD and Intel server CPUs), one token or 32: tiles of 6 rows x
   4 tokens as the AVX-512 tiles above, where vdpbf16ps multiplies 32 bfloat16 pairs of a row and a token into 16
   float32 sums in one instruction; the kernels above widen the row (two instructions per 16 weights) and run one FMA
   per 16. Faster than the row kernel at a few tokens (at one it reads the weights near a plain read's rate; six rows
   side by side cost nothing here), and than the AVX-512F tiles and oneDNN's bfloat16 GEMM at 8 to 32
   (docs/performance.md, 'Batched decode'). The products are exact in float32 and each is added with one rounding, as an
   FMA adds it; what differs is the order (elements 2i and 2i + 1 of a stretch into lane i) and that the instruction
   treats denormal inputs and results as zero (bfloat16 values below ~1.2e-38, which a model's weights and activations
   do not hold). The inputs are the step's tokens in bfloat16, as the lean forward hands them to torch's matmul (after
   an RMSNorm, rounded to bfloat16 as there). Each (row, token) sums in one accumulator, k in steps of 32 in order: a
   token's value does not depend on the others in its step, nor on how many there are. */
__attribute__((target("avx512f,avx512bf16"), always_inline))
static inline void tile_bf16dot(const void *w, size_t row_bytes, const uint16_t *xb, int64_t K, int nr, int nt,
                                int pass, int passes, float out[6][4]) {
    __m512 a[6][4];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) a[r][t] = _mm512_setzero_ps();
    /* the next 6 rows' lines, spread over every pass as the AVX-512 tile spreads them */
    const int64_t steps = K / 32, lines = 6 * ((K * 2 + 63) / 64);
    const int64_t per_step = steps > 0 ? (lines + passes * steps - 1) / (passes * steps) : 0;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const int64_t first = (pass * steps + k / 32) * per_step;
        for (int64_t j = first; j < first + per_step && j < lines; j++)
            _mm_prefetch((const char *)w + (6 + j % 6) * row_bytes + (j / 6) * 64, _MM_HINT_T1);
        __m512bh wv[6];
        for (int r = 0; r < nr; r++)
            wv[r] = (__m512bh)_mm512_loadu_si512((const void *)((const char *)w + r * row_bytes + k * 2));
        for (int t = 0; t < nt; t++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xb + t * K + k));
            for (int r = 0; r < nr; r++) a[r][t] = _mm512_dpbf16_ps(a[r][t], wv[r], xv);
        }
    }
    for (int r = 0; r < nr; r++) {
        const void *wr = (const char *)w + r * row_bytes;
        for (int t = 0; t < nt; t++) {
            float s = _mm512_reduce_add_ps(a[r][t]);
            for (int64_t j = k; j < K; j++) s += load_scalar(DT_BF16, wr, j) * bf16_to_f32(xb[t * K + j]);
            out[r][t] = s;
        }
    }
}

#define TILE_BF16DOT(NR, NT) tile_bf16dot(w, row_bytes, xb + t0 * K, K, NR, NT, (int)(t0 / 4), (int)((T + 3) / 4), v)
#define TILE_BF16DOT_ROWS(NR) TILE_TOKENS(TILE_BF16DOT, NR)

/* Rows n .. n + nr - 1 (w is row n) for every token: y[t * ldy + n + r] (+ bias[n + r]), all bfloat16. */
__attribute__((target("avx512f,avx512bf16")))
static void rows_bf16dot(const void *w, size_t row_bytes, const uint16_t *xb, int64_t K, int64_t T, int nr, void *y,
                         int64_t ldy, int64_t n, const void *bias) {
    SIX_ROW_TILES(TILE_BF16DOT_ROWS, DT_BF16)
}

/* Whether bfloat16 steps run the AVX512-BF16 tiles: where the CPU has AVX512-BF16, the kernels
   run AVX-512 (not capped to AVX2) and they were not turned off. `on` < 0 asks; 0 turns them off in this process (to
   compare, or to check the AVX-512F tiles on such a CPU); 1 on again. Returns whether they run now. */
static int bf16_dot_off = 0, cpu_bf16 = -1;

int tandem_matvec_bf16_dot(int on) {
    if (cpu_bf16 < 0) {
        __builtin_cpu_init();
        cpu_bf16 = __builtin_cpu_supports("avx512bf16") ? 1 : 0;
    }
    if (on >= 0) bf16_dot_off = !on;
    return !bf16_dot_off && cpu_bf16 && tandem_matvec_isa() == 2;
}
