/* The float32 blocks of prefill_attention.c on AVX2 with FMA (16 256-bit registers): tiles of LANES8 query positions
   in one vector, and of LANES16 in two for chunks of more than LANES8 (each broadcast element of a key's or a value's
   row feeding both halves: ~0.75 loads an FMA instead of ~1.1). Included by prefill_attention.c after its Call, State,
   constants and OPAQUE; the same steps as its AVX-512 blocks. */

#define LANES16 16 /* two 256-bit vectors */
#define KG4 4      /* keys whose scores are computed at once in two vectors: 2 x KG4 accumulators */
#define DG4 4      /* head dimensions of the output updated at once in two vectors: 2 x DG4 accumulators */

/* ---- float32 on AVX2: tiles of LANES8 query positions, the same steps in 256-bit vectors ---------------------- */

__attribute__((target("avx2,fma"), always_inline))
static inline void scores_f32_avx2(const float *qt, const float *const *rows, int n, int64_t D, __m256 *out) {
    __m256 acc[KG];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m256 qd = _mm256_loadu_ps(qt + d * LANES8);
        _Pragma("GCC unroll 8")
        for (int t = 0; t < KG; t++)
            if (t < n) acc[t] = _mm256_fmadd_ps(qd, _mm256_set1_ps(rows[t][d]), acc[t]);
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG; t++)
        if (t < n) out[t] = acc[t];
}

__attribute__((target("avx2,fma")))
static void block_f32_avx2(const Call *c, State *st, const float *const *krows, const float *const *vrows,
                           int64_t i0, int64_t j0, int kb, float *s) {
    const __m256 scale = _mm256_set1_ps(c->scale), hidden_value = _mm256_set1_ps(-INFINITY);
    const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32((int)(c->first + i0)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const int masked = j0 + kb - 1 > c->first + i0;
    __m256 bmax = hidden_value;
    for (int j = 0; j < kb; j += KG) {
        int n = kb - j < KG ? kb - j : KG;
        __m256 sc[KG];
        if (n == KG) scores_f32_avx2(st->qt, krows + j, KG, c->D, sc);
        else scores_f32_avx2(st->qt, krows + j, n, c->D, sc);
        for (int t = 0; t < n; t++) {
            __m256 x = _mm256_mul_ps(sc[t], scale);
            if (masked) {  /* key j0 + j + t past a lane's position: -inf */
                __m256i hidden = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(j0 + j + t)), pos);
                x = _mm256_blendv_ps(x, hidden_value, _mm256_castsi256_ps(hidden));
            }
            bmax = _mm256_max_ps(bmax, x);
            _mm256_storeu_ps(s + (j + t) * LANES8, x);
        }
    }
    __m256 m_old = _mm256_loadu_ps(st->m), m_new = _mm256_max_ps(m_old, bmax);
    __m256 alpha = exp_256(_mm256_sub_ps(m_old, m_new)), sum = _mm256_setzero_ps();
    for (int j = 0; j < kb; j++) {
        __m256 p = exp_256(_mm256_sub_ps(_mm256_loadu_ps(s + j * LANES8), m_new));
        sum = _mm256_add_ps(sum, p);
        _mm256_storeu_ps(s + j * LANES8, p);
    }
    _mm256_storeu_ps(st->m, m_new);
    _mm256_storeu_ps(st->l, _mm256_fmadd_ps(_mm256_loadu_ps(st->l), alpha, sum));
    for (int64_t d0 = 0; d0 < c->D; d0 += DG8) {
        __m256 acc[DG8];
        _Pragma("GCC unroll 8")
        for (int u = 0; u < DG8; u++) acc[u] = _mm256_mul_ps(_mm256_loadu_ps(st->o + (d0 + u) * LANES8), alpha);
        for (int j = 0; j < kb; j++) {
            __m256 p = _mm256_loadu_ps(s + j * LANES8);
            const float *row = vrows[j] + d0;
            OPAQUE(row);
            _Pragma("GCC unroll 8")
            for (int u = 0; u < DG8; u++) acc[u] = _mm256_fmadd_ps(p, _mm256_set1_ps(row[u]), acc[u]);
        }
        _Pragma("GCC unroll 8")
        for (int u = 0; u < DG8; u++) _mm256_storeu_ps(st->o + (d0 + u) * LANES8, acc[u]);
    }
}

__attribute__((target("avx2,fma"), always_inline))
static inline void scores_f32x2_avx2(const float *qt, const float *const *rows, int n, int64_t D, __m256 *lo,
                                     __m256 *hi) {
    __m256 a[KG4], b[KG4];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < KG4; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m256 q0 = _mm256_loadu_ps(qt + d * LANES16), q1 = _mm256_loadu_ps(qt + d * LANES16 + LANES8);
        _Pragma("GCC unroll 4")
        for (int t = 0; t < KG4; t++)
            if (t < n) {
                __m256 k = _mm256_set1_ps(rows[t][d]);
                a[t] = _mm256_fmadd_ps(q0, k, a[t]);
                b[t] = _mm256_fmadd_ps(q1, k, b[t]);
            }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < KG4; t++)
        if (t < n) lo[t] = a[t], hi[t] = b[t];
}

__attribute__((target("avx2,fma")))
static void block_f32x2_avx2(const Call *c, State *st, const float *const *krows, const float *const *vrows,
                             int64_t i0, int64_t j0, int kb, float *s) {
    const __m256 scale = _mm256_set1_ps(c->scale), hidden_value = _mm256_set1_ps(-INFINITY);
    const __m256i pos0 = _mm256_add_epi32(_mm256_set1_epi32((int)(c->first + i0)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i pos1 = _mm256_add_epi32(pos0, _mm256_set1_epi32(LANES8));
    const int masked = j0 + kb - 1 > c->first + i0;
    __m256 max0 = hidden_value, max1 = hidden_value;
    for (int j = 0; j < kb; j += KG4) {
        int n = kb - j < KG4 ? kb - j : KG4;
        __m256 lo[KG4], hi[KG4];
        if (n == KG4) scores_f32x2_avx2(st->qt, krows + j, KG4, c->D, lo, hi);
        else scores_f32x2_avx2(st->qt, krows + j, n, c->D, lo, hi);
        for (int t = 0; t < n; t++) {
            __m256 x0 = _mm256_mul_ps(lo[t], scale), x1 = _mm256_mul_ps(hi[t], scale);
            if (masked) {  /* key j0 + j + t past a lane's position: -inf */
                __m256i key = _mm256_set1_epi32((int)(j0 + j + t));
                x0 = _mm256_blendv_ps(x0, hidden_value, _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, pos0)));
                x1 = _mm256_blendv_ps(x1, hidden_value, _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, pos1)));
            }
            max0 = _mm256_max_ps(max0, x0);
            max1 = _mm256_max_ps(max1, x1);
            _mm256_storeu_ps(s + (j + t) * LANES16, x0);
            _mm256_storeu_ps(s + (j + t) * LANES16 + LANES8, x1);
        }
    }
    __m256 m_old0 = _mm256_loadu_ps(st->m), m_new0 = _mm256_max_ps(m_old0, max0);
    __m256 m_old1 = _mm256_loadu_ps(st->m + LANES8), m_new1 = _mm256_max_ps(m_old1, max1);
    __m256 alpha0 = exp_256(_mm256_sub_ps(m_old0, m_new0)), alpha1 = exp_256(_mm256_sub_ps(m_old1, m_new1));
    __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
    for (int j = 0; j < kb; j++) {
        __m256 p0 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(s + j * LANES16), m_new0));
        __m256 p1 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(s + j * LANES16 + LANES8), m_new1));
        sum0 = _mm256_add_ps(sum0, p0);
        sum1 = _mm256_add_ps(sum1, p1);
        _mm256_storeu_ps(s + j * LANES16, p0);
        _mm256_storeu_ps(s + j * LANES16 + LANES8, p1);
    }
    _mm256_storeu_ps(st->m, m_new0);
    _mm256_storeu_ps(st->m + LANES8, m_new1);
    _mm256_storeu_ps(st->l, _mm256_fmadd_ps(_mm256_loadu_ps(st->l), alpha0, sum0));
    _mm256_storeu_ps(st->l + LANES8, _mm256_fmadd_ps(_mm256_loadu_ps(st->l + LANES8), alpha1, sum1));
    for (int64_t d0 = 0; d0 < c->D; d0 += DG4) {
        __m256 a[DG4], b[DG4];
        _Pragma("GCC unroll 4")
        for (int u = 0; u < DG4; u++) {
            a[u] = _mm256_mul_ps(_mm256_loadu_ps(st->o + (d0 + u) * LANES16), alpha0);
            b[u] = _mm256_mul_ps(_mm256_loadu_ps(st->o + (d0 + u) * LANES16 + LANES8), alpha1);
        }
        for (int j = 0; j < kb; j++) {
            __m256 p0 = _mm256_loadu_ps(s + j * LANES16), p1 = _mm256_loadu_ps(s + j * LANES16 + LANES8);
            const float *row = vrows[j] + d0;
            OPAQUE(row);
            _Pragma("GCC unroll 4")
            for (int u = 0; u < DG4; u++) {
                __m256 v = _mm256_set1_ps(row[u]);
                a[u] = _mm256_fmadd_ps(p0, v, a[u]);
                b[u] = _mm256_fmadd_ps(p1, v, b[u]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int u = 0; u < DG4; u++) {
            _mm256_storeu_ps(st->o + (d0 + u) * LANES16, a[u]);
            _mm256_storeu_ps(st->o + (d0 + u) * LANES16 + LANES8, b[u]);
        }
    }
}
