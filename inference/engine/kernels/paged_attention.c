/* Tandem's paged decode-attention kernel for CPU decode steps (inference/engine/paged_attention.py loads it).

   One new token per sequence against its cached context, read in place from the paged KV cache: key position t of
   sequence b is row t % bs of block block_tables[b][t / bs] of the layer's cache [N, bs, Hkv, D] (D contiguous). The
   G = Hq / Hkv query heads that share KV head h (query head h * G + g reads KV head h, Hugging Face's repeat_kv
   order) are computed together, so each K and V row is read from memory once per step and layer, not gathered into
   a padded copy first (what torch's path does: index_select of every block, a mask, SDPA).

   Per (sequence, KV head): scores s[g][t] = (scale * q[g]) . k[t]; softmax with the maximum subtracted; the weighted
   sum of V rows; divided by the softmax's sum. Arithmetic in float32 (bfloat16 and float16 caches and bfloat16
   queries widened exactly, the output rounded once, to nearest even as torch rounds); exp is a polynomial within ~2
   float32 ulps of expf. The cache's dtype may be narrower than the queries' (Config.kv_cache_dtype: a float32 model
   with a float16 or bfloat16 cache reads half the bytes a step).
   Sums run in another order than SDPA's, so values are not bit-identical to torch's (within float32 rounding;
   bfloat16: within one rounding of the output); greedy tokens are (tests/inference/engine/test_paged_attention.py).

   No -march: each kernel is compiled for its own instruction set (target attributes) and picked at run time
   (kernels.h: AVX-512F, else AVX2 with FMA); tandem_paged_attention_isa() says which, 0 for neither. */
#include "kernels.h"

TANDEM_ISA_FUNCTIONS(tandem_paged_attention)

/* One task, a sequence's KV heads (all of them, or one): what the per-ISA kernels read and write. */
typedef struct {
    const char *k, *v;       /* the layer's caches [N, bs, Hkv, D], at the task's first KV head */
    int64_t H;               /* the task's KV heads, one after another in each position's row */
    const int64_t *table;    /* the sequence's blocks [>= ceil(n / bs)] */
    int64_t n;               /* context length */
    int64_t bs;              /* block size */
    size_t row_bytes;        /* bytes from one position's row to the next (Hkv * D elements) */
    size_t block_bytes;      /* bytes of one block (bs * Hkv * D elements) */
    size_t head_bytes;       /* bytes of one KV head's part of a row (D elements) */
    int64_t G, D;            /* query heads per KV head; head dim, a multiple of 16 */
    const float *q;          /* [H * G, D]: the queries, widened and multiplied by the scale */
    float *scores;           /* [H * G, n]: scores, then unnormalized probabilities */
    float *acc;              /* [H * G, D]: the output */
    float *sums;             /* [H * G]: the softmax's sums */
    const char *next_k;      /* the next task's first run of K blocks (this thread's), or NULL */
    size_t next_k_bytes;
} Task;

/* Part `part` of `parts` of a stretch of the cache into L2, while the stretch before it is computed: a few lines at
   each group of keys, not all at once. Blocks lie anywhere in the pool, so the hardware prefetcher, which follows a
   stream within a block, cannot guess the next. The next run's lines all at once into L1 (prefetcht0, as before)
   read the cache at about half a plain read's rate; spread over the groups into L2 (prefetcht1), with the phases'
   and the tasks' first runs too (ahead), far faster, and so were the float32 calls; a read of the blocks alone,
   nothing computed, nearly doubled its rate with the second. The figures: docs/performance.md, 'Decode attention
   at the memory's rate'. */
static inline void prefetch_part(const char *block, size_t bytes, int64_t part, int64_t parts) {
    size_t end = bytes * (size_t)(part + 1) / (size_t)parts;
    for (size_t o = bytes * (size_t)part / (size_t)parts & ~(size_t)63; o < end; o += 64)
        __builtin_prefetch(block + o, 0, 2);
}

/* Blocks of keys read as one: a sequence's blocks j, j + 1, ... that lie one after another in the pool (a prompt's,
   allocated at once from the free list in order, mostly do) continue the same rows at the same stride, so a run of
   them is a block of r * bs keys, prefetched whole (ahead). Runs stop at RUN_KEYS keys: SmolLM2's decode
   steps ran fastest with 64-key blocks against 16, 32 and 128 (one stream at 1,024 tokens, 16 streams at 512:
   docs/performance.md, "Prefill attention in a kernel of its own"). */
#define RUN_KEYS 64
static inline int64_t run_of_blocks(const Task *p, int64_t j, int64_t t0) {
    int64_t r = 1;
    while (r * p->bs < RUN_KEYS && t0 + r * p->bs < p->n && p->table[j + r] == p->table[j] + r) r++;
    return r;
}

/* What to bring into L2 while the run of blocks from block j (key t0, r blocks) of `cache` is computed: the next
   run, or after the last one `then` (V's first run after K's last; the next task's first run of K blocks after V's
   last, where the caller knows it), `then_bytes` of it. */
typedef struct {
    const char *at;
    size_t bytes;
} Ahead;
static inline Ahead ahead(const Task *p, const char *cache, int64_t j, int64_t r, int64_t t0, const char *then,
                          size_t then_bytes) {
    if (t0 + r * p->bs < p->n)
        return (Ahead){cache + (size_t)p->table[j + r] * p->block_bytes,
                       p->block_bytes * (size_t)run_of_blocks(p, j + r, t0 + r * p->bs)};
    return (Ahead){then, then ? then_bytes : 0};
}
static inline Ahead first_v(const Task *p) {
    return (Ahead){p->v + (size_t)p->table[0] * p->block_bytes, p->block_bytes * (size_t)run_of_blocks(p, 0, 0)};
}

/* ---- AVX-512F -------------------------------------------------------------------------------------------------- */

__attribute__((target("avx512f")))
static inline __m512 load16_512(int dtype, const char *row, int64_t d) {
    if (dtype == DT_F32) return _mm512_loadu_ps((const float *)row + d);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d));
    if (dtype == DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f")))
static inline __m256 fold_512(__m512 a) {  /* 16 partial sums -> 8 */
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* Eight vectors of partial sums -> their eight sums, in order: one tree of horizontal adds instead of a full
   reduction per dot product (which cost as much as the products at D = 64). */
__attribute__((target("avx2")))
static inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                           __m256 a7) {
    __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  /* [a0..a3 low; a0..a3 high] */
    __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

__attribute__((target("avx512f"), always_inline))
static inline void task_avx512_as(int dtype, const Task *p) {
    const int64_t n = p->n, bs = p->bs, G = p->G, D = p->D, HG = p->H * p->G;
    const size_t rb = p->row_bytes;
    /* 1. Scores, a block at a time: eight keys' dot products side by side, reduced together. */
    const Ahead v0 = first_v(p);  /* read after K's last run */
    for (int64_t j = 0, t0 = 0, r; t0 < n; j += r, t0 += r * bs) {
        r = run_of_blocks(p, j, t0);  /* blocks j .. j + r - 1 lie one after another: one block of r * bs keys */
        const int64_t m = n - t0 < r * bs ? n - t0 : r * bs;
        const Ahead next = ahead(p, p->k, j, r, t0, v0.at, v0.bytes);
        const int64_t groups = (m + 7) / 8, parts = HG * groups;
        for (int64_t g = 0; g < HG; g++) {  /* query row g reads KV head g / G */
            const char *kb = p->k + (size_t)p->table[j] * p->block_bytes + (size_t)(g / G) * p->head_bytes;
            const float *q = p->q + g * D;
            float *s = p->scores + g * n + t0;
            int64_t i = 0;
            for (; i + 8 <= m; i += 8) {
                prefetch_part(next.at, next.bytes, g * groups + i / 8, parts);
                const char *r = kb + (size_t)i * rb;
                __m512 a[8];
                for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_ps();
                for (int64_t d = 0; d < D; d += 16) {
                    __m512 qv = _mm512_loadu_ps(q + d);
                    for (int u = 0; u < 8; u++) a[u] = _mm512_fmadd_ps(load16_512(dtype, r + u * rb, d), qv, a[u]);
                }
                _mm256_storeu_ps(s + i, hsum8(fold_512(a[0]), fold_512(a[1]), fold_512(a[2]), fold_512(a[3]),
                                              fold_512(a[4]), fold_512(a[5]), fold_512(a[6]), fold_512(a[7])));
            }
            if (i < m) prefetch_part(next.at, next.bytes, g * groups + groups - 1, parts);
            for (; i < m; i++) {
                __m512 a = _mm512_setzero_ps();
                for (int64_t d = 0; d < D; d += 16)
                    a = _mm512_fmadd_ps(load16_512(dtype, kb + (size_t)i * rb, d), _mm512_loadu_ps(q + d), a);
                s[i] = _mm512_reduce_add_ps(a);
            }
        }
    }
    /* 2. Softmax numerators in place, each query's maximum subtracted; sums kept for the end. */
    for (int64_t g = 0; g < HG; g++) {
        float *s = p->scores + g * n;
        __m512 mv = _mm512_set1_ps(-INFINITY);
        int64_t t = 0;
        for (; t + 16 <= n; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
        float mx = _mm512_reduce_max_ps(mv);
        for (; t < n; t++) mx = s[t] > mx ? s[t] : mx;
        __m512 mb = _mm512_set1_ps(mx), sv = _mm512_setzero_ps();
        for (t = 0; t + 16 <= n; t += 16) {
            __m512 e = exp_512(_mm512_sub_ps(_mm512_loadu_ps(s + t), mb));
            _mm512_storeu_ps(s + t, e);
            sv = _mm512_add_ps(sv, e);
        }
        float sum = _mm512_reduce_add_ps(sv);
        for (; t < n; t++) {
            s[t] = expf(s[t] - mx);
            sum += s[t];
        }
        p->sums[g] = sum;
    }
    /* 3. The weighted sum of V, a block at a time (its rows stay in L1 for every query head), 64 columns of the
       output in registers at once, two keys at a time into two sets of sums (eight chains of FMAs hide their
       latency better than four). */
    memset(p->acc, 0, sizeof(float) * (size_t)(HG * D));
    for (int64_t j = 0, t0 = 0, r; t0 < n; j += r, t0 += r * bs) {
        r = run_of_blocks(p, j, t0);  /* blocks j .. j + r - 1 lie one after another: one block of r * bs keys */
        const int64_t m = n - t0 < r * bs ? n - t0 : r * bs;
        const Ahead next = ahead(p, p->v, j, r, t0, p->next_k, p->next_k_bytes);
        const int64_t pairs = (m + 1) / 2, parts = HG * pairs;
        for (int64_t g = 0; g < HG; g++) {
            const char *vb = p->v + (size_t)p->table[j] * p->block_bytes + (size_t)(g / G) * p->head_bytes;
            const float *w = p->scores + g * n + t0;
            float *o = p->acc + g * D;
            int64_t d = 0;
            for (; d + 64 <= D; d += 64) {
                __m512 a0 = _mm512_loadu_ps(o + d), a1 = _mm512_loadu_ps(o + d + 16);
                __m512 a2 = _mm512_loadu_ps(o + d + 32), a3 = _mm512_loadu_ps(o + d + 48);
                __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
                int64_t i = 0;
                for (; i + 2 <= m; i += 2) {
                    if (d == 0) prefetch_part(next.at, next.bytes, g * pairs + i / 2, parts);
                    const char *r = vb + (size_t)i * rb, *r1 = r + rb;
                    __m512 wv = _mm512_set1_ps(w[i]), wv1 = _mm512_set1_ps(w[i + 1]);
                    a0 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d), a0);
                    a1 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d + 16), a1);
                    a2 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d + 32), a2);
                    a3 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d + 48), a3);
                    b0 = _mm512_fmadd_ps(wv1, load16_512(dtype, r1, d), b0);
                    b1 = _mm512_fmadd_ps(wv1, load16_512(dtype, r1, d + 16), b1);
                    b2 = _mm512_fmadd_ps(wv1, load16_512(dtype, r1, d + 32), b2);
                    b3 = _mm512_fmadd_ps(wv1, load16_512(dtype, r1, d + 48), b3);
                }
                if (i < m) {
                    if (d == 0) prefetch_part(next.at, next.bytes, g * pairs + pairs - 1, parts);
                    const char *r = vb + (size_t)i * rb;
                    __m512 wv = _mm512_set1_ps(w[i]);
                    a0 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d), a0);
                    a1 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d + 16), a1);
                    a2 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d + 32), a2);
                    a3 = _mm512_fmadd_ps(wv, load16_512(dtype, r, d + 48), a3);
                }
                _mm512_storeu_ps(o + d, _mm512_add_ps(a0, b0));
                _mm512_storeu_ps(o + d + 16, _mm512_add_ps(a1, b1));
                _mm512_storeu_ps(o + d + 32, _mm512_add_ps(a2, b2));
                _mm512_storeu_ps(o + d + 48, _mm512_add_ps(a3, b3));
            }
            for (; d < D; d += 16) {  /* the last columns (D % 64); all of them where D < 64 */
                __m512 a0 = _mm512_loadu_ps(o + d);
                for (int64_t i = 0; i < m; i++) {
                    if (d == 0 && i % 2 == 0) prefetch_part(next.at, next.bytes, g * pairs + i / 2, parts);
                    a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[i]), load16_512(dtype, vb + (size_t)i * rb, d), a0);
                }
                _mm512_storeu_ps(o + d, a0);
            }
        }
    }
    for (int64_t g = 0; g < HG; g++) {
        __m512 inv = _mm512_set1_ps(1.0f / p->sums[g]);
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(p->acc + g * D + d, _mm512_mul_ps(_mm512_loadu_ps(p->acc + g * D + d), inv));
    }
}

__attribute__((target("avx512f")))
static void task_avx512(int dtype, const Task *p) {  /* one copy of the loops per cache dtype, no branch inside */
    if (dtype == DT_F32) task_avx512_as(DT_F32, p);
    else if (dtype == DT_BF16) task_avx512_as(DT_BF16, p);
    else task_avx512_as(DT_F16, p);
}

/* ---- AVX2 + FMA ------------------------------------------------------------------------------------------------ */

/* F16C for float16 caches only: the entry point refuses them on a CPU without it. */
__attribute__((target("avx2,fma,f16c")))
static inline __m256 load8_256(int dtype, const char *row, int64_t d) {
    if (dtype == DT_F32) return _mm256_loadu_ps((const float *)row + d);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d));
    if (dtype == DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2")))
static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void task_avx2_as(int dtype, const Task *p) {
    const int64_t n = p->n, bs = p->bs, G = p->G, D = p->D, HG = p->H * p->G;
    const size_t rb = p->row_bytes;
    /* 1. Scores, a block at a time: eight keys' dot products side by side, reduced together. */
    const Ahead v0 = first_v(p);  /* read after K's last run */
    for (int64_t j = 0, t0 = 0, r; t0 < n; j += r, t0 += r * bs) {
        r = run_of_blocks(p, j, t0);  /* blocks j .. j + r - 1 lie one after another: one block of r * bs keys */
        const int64_t m = n - t0 < r * bs ? n - t0 : r * bs;
        const Ahead next = ahead(p, p->k, j, r, t0, v0.at, v0.bytes);
        const int64_t groups = (m + 7) / 8, parts = HG * groups;
        for (int64_t g = 0; g < HG; g++) {  /* query row g reads KV head g / G */
            const char *kb = p->k + (size_t)p->table[j] * p->block_bytes + (size_t)(g / G) * p->head_bytes;
            const float *q = p->q + g * D;
            float *s = p->scores + g * n + t0;
            int64_t i = 0;
            for (; i + 8 <= m; i += 8) {
                prefetch_part(next.at, next.bytes, g * groups + i / 8, parts);
                const char *r = kb + (size_t)i * rb;
                __m256 a[8];
                for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 8) {
                    __m256 qv = _mm256_loadu_ps(q + d);
                    for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(load8_256(dtype, r + u * rb, d), qv, a[u]);
                }
                _mm256_storeu_ps(s + i, hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
            }
            if (i < m) prefetch_part(next.at, next.bytes, g * groups + groups - 1, parts);
            for (; i < m; i++) {
                __m256 a = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 8)
                    a = _mm256_fmadd_ps(load8_256(dtype, kb + (size_t)i * rb, d), _mm256_loadu_ps(q + d), a);
                s[i] = hsum_avx2(a);
            }
        }
    }
    /* 2. Softmax numerators in place, each query's maximum subtracted; sums kept for the end. */
    for (int64_t g = 0; g < HG; g++) {
        float *s = p->scores + g * n;
        __m256 mv = _mm256_set1_ps(-INFINITY);
        int64_t t = 0;
        for (; t + 8 <= n; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + t));
        float mx = hmax(mv);
        for (; t < n; t++) mx = s[t] > mx ? s[t] : mx;
        __m256 mb = _mm256_set1_ps(mx), sv = _mm256_setzero_ps();
        for (t = 0; t + 8 <= n; t += 8) {
            __m256 e = exp_256(_mm256_sub_ps(_mm256_loadu_ps(s + t), mb));
            _mm256_storeu_ps(s + t, e);
            sv = _mm256_add_ps(sv, e);
        }
        float sum = hsum_avx2(sv);
        for (; t < n; t++) {
            s[t] = expf(s[t] - mx);
            sum += s[t];
        }
        p->sums[g] = sum;
    }
    /* 3. The weighted sum of V, a block at a time, 32 columns of the output in registers, two keys at a time. */
    memset(p->acc, 0, sizeof(float) * (size_t)(HG * D));
    for (int64_t j = 0, t0 = 0, r; t0 < n; j += r, t0 += r * bs) {
        r = run_of_blocks(p, j, t0);  /* blocks j .. j + r - 1 lie one after another: one block of r * bs keys */
        const int64_t m = n - t0 < r * bs ? n - t0 : r * bs;
        const Ahead next = ahead(p, p->v, j, r, t0, p->next_k, p->next_k_bytes);
        const int64_t pairs = (m + 1) / 2, parts = HG * pairs;
        for (int64_t g = 0; g < HG; g++) {
            const char *vb = p->v + (size_t)p->table[j] * p->block_bytes + (size_t)(g / G) * p->head_bytes;
            const float *w = p->scores + g * n + t0;
            float *o = p->acc + g * D;
            int64_t d = 0;
            for (; d + 32 <= D; d += 32) {
                __m256 a0 = _mm256_loadu_ps(o + d), a1 = _mm256_loadu_ps(o + d + 8);
                __m256 a2 = _mm256_loadu_ps(o + d + 16), a3 = _mm256_loadu_ps(o + d + 24);
                __m256 b0 = _mm256_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
                int64_t i = 0;
                for (; i + 2 <= m; i += 2) {
                    if (d == 0) prefetch_part(next.at, next.bytes, g * pairs + i / 2, parts);
                    const char *r = vb + (size_t)i * rb, *r1 = r + rb;
                    __m256 wv = _mm256_set1_ps(w[i]), wv1 = _mm256_set1_ps(w[i + 1]);
                    a0 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d), a0);
                    a1 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d + 8), a1);
                    a2 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d + 16), a2);
                    a3 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d + 24), a3);
                    b0 = _mm256_fmadd_ps(wv1, load8_256(dtype, r1, d), b0);
                    b1 = _mm256_fmadd_ps(wv1, load8_256(dtype, r1, d + 8), b1);
                    b2 = _mm256_fmadd_ps(wv1, load8_256(dtype, r1, d + 16), b2);
                    b3 = _mm256_fmadd_ps(wv1, load8_256(dtype, r1, d + 24), b3);
                }
                if (i < m) {
                    if (d == 0) prefetch_part(next.at, next.bytes, g * pairs + pairs - 1, parts);
                    const char *r = vb + (size_t)i * rb;
                    __m256 wv = _mm256_set1_ps(w[i]);
                    a0 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d), a0);
                    a1 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d + 8), a1);
                    a2 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d + 16), a2);
                    a3 = _mm256_fmadd_ps(wv, load8_256(dtype, r, d + 24), a3);
                }
                _mm256_storeu_ps(o + d, _mm256_add_ps(a0, b0));
                _mm256_storeu_ps(o + d + 8, _mm256_add_ps(a1, b1));
                _mm256_storeu_ps(o + d + 16, _mm256_add_ps(a2, b2));
                _mm256_storeu_ps(o + d + 24, _mm256_add_ps(a3, b3));
            }
            for (; d < D; d += 8) {  /* the last columns (D % 32); all of them where D < 32 */
                __m256 a0 = _mm256_loadu_ps(o + d);
                for (int64_t i = 0; i < m; i++) {
                    if (d == 0 && i % 2 == 0) prefetch_part(next.at, next.bytes, g * pairs + i / 2, parts);
                    a0 = _mm256_fmadd_ps(_mm256_set1_ps(w[i]), load8_256(dtype, vb + (size_t)i * rb, d), a0);
                }
                _mm256_storeu_ps(o + d, a0);
            }
        }
    }
    for (int64_t g = 0; g < HG; g++) {
        __m256 inv = _mm256_set1_ps(1.0f / p->sums[g]);
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(p->acc + g * D + d, _mm256_mul_ps(_mm256_loadu_ps(p->acc + g * D + d), inv));
    }
}

__attribute__((target("avx2,fma,f16c")))
static void task_avx2(int dtype, const Task *p) {
    if (dtype == DT_F32) task_avx2_as(DT_F32, p);
    else if (dtype == DT_BF16) task_avx2_as(DT_BF16, p);
    else task_avx2_as(DT_F16, p);
}

/* ---- entry point ----------------------------------------------------------------------------------------------- */

/* out[b, h * G + g, :] for every sequence b < B, KV head h < Hkv, g < G = Hq / Hkv:
   q, out: [B, Hq, D] contiguous, in `dtype`; k_cache, v_cache: one layer's [N, bs, Hkv, D] contiguous, in `kv_dtype`
   (a cache may be narrower than the activations: float16 or bfloat16 beside float32); block_tables: [B, M] at row
   stride ldt; context_lens: [B], each >= 1 and <= M * bs. Returns 0, or -1 when the CPU has neither instruction set,
   -2 when scratch cannot grow, -3 when D is not a multiple of 16, Hq not one of Hkv, or the cache float16 on an AVX2
   CPU without F16C (nothing written for -1 and -3). */
int tandem_paged_attention(int dtype, int kv_dtype, const void *q, void *out, const void *k_cache, const void *v_cache,
                           const int64_t *block_tables, int64_t ldt, const int64_t *context_lens, int64_t B,
                           int64_t Hq, int64_t Hkv, int64_t D, int64_t bs, float scale, int num_threads) {
    int which = tandem_paged_attention_isa();
    if (which == 0) return -1;
    if (D % 16 != 0 || Hkv <= 0 || Hq % Hkv != 0) return -3;
    if (kv_dtype == DT_F16 && which == 1 && !__builtin_cpu_supports("f16c")) return -3;
    const int64_t G = Hq / Hkv;
    const size_t esize = dtype_size(kv_dtype);
    int64_t work = 0;  /* elements of K and V read */
    for (int64_t b = 0; b < B; b++) work += context_lens[b] * Hkv * D;
    const int parallel = num_threads > 1 && work >= 65536;
    /* A task is a sequence's KV heads together, so that each block (bs rows of Hkv * D elements) is read as one
       contiguous stream; a head's rows alone are a strided read (one head in Hkv), which made a call slower. With fewer
       sequences than threads, a task is one KV head, so that the threads share the heads. */
    const int64_t H = parallel && B < num_threads ? 1 : Hkv;
    int failed = 0;
    /* dynamic: the tasks differ by their context lengths */
    #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (parallel)
    for (int64_t task = 0; task < B * (Hkv / H); task++) {
        const int64_t b = task / (Hkv / H), h = task % (Hkv / H) * H, n = context_lens[b];
        const int64_t rows = H * G;  /* query rows of the task */
        float *buf = thread_scratch((size_t)(rows * (2 * D + 1 + n)));  /* each thread's own */
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
            continue;
        }
        Task p = {.k = (const char *)k_cache + (size_t)(h * D) * esize,
                  .v = (const char *)v_cache + (size_t)(h * D) * esize, .H = H,
                  .table = block_tables + b * ldt, .n = n, .bs = bs,
                  .row_bytes = (size_t)(Hkv * D) * esize, .block_bytes = (size_t)(bs * Hkv * D) * esize,
                  .head_bytes = (size_t)D * esize,
                  .G = G, .D = D, .q = buf, .acc = buf + rows * D, .sums = buf + 2 * rows * D,
                  .scores = buf + rows * (2 * D + 1)};
        /* one thread runs the tasks in order: the next one's first run of K blocks is read while this one's last V
           run is computed */
        const int64_t following = task + 1, nb = following / (Hkv / H);
        if (!parallel && following < B * (Hkv / H) && context_lens[nb] > 0) {
            Task next = p;
            next.table = block_tables + nb * ldt;
            next.n = context_lens[nb];
            p.next_k = (const char *)k_cache + ((size_t)(following % (Hkv / H) * H * D)) * esize +
                       (size_t)next.table[0] * p.block_bytes;
            p.next_k_bytes = p.block_bytes * (size_t)run_of_blocks(&next, 0, 0);
        }
        const int64_t first = (b * Hq + h * G) * D;  /* element of q and out where the task's rows start */
        for (int64_t i = 0; i < rows * D; i++) buf[i] = load_scalar(dtype, q, first + i) * scale;
        if (n <= 0) memset(p.acc, 0, sizeof(float) * (size_t)(rows * D));
        else if (which == 2) task_avx512(kv_dtype, &p);
        else task_avx2(kv_dtype, &p);
        for (int64_t i = 0; i < rows * D; i++) store_scalar(dtype, out, first + i, p.acc[i]);
    }
    return failed ? -2 : 0;
}
