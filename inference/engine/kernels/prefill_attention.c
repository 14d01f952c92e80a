/* Tandem's prefill-attention kernel for CPU prefill steps (inference/engine/prefill_attention.py loads it).

   Causal attention of one sequence's chunk of C queries (positions first, ..., first + C - 1) over its keys 0 ..
   first + C - 1: the chunk's own K/V and, for a chunk after a cached prefix, the prefix's rows read in place from the
   paged cache (key position j's row at `k + slots[j] * ld_k`, as the decode kernel reads them). Query position p
   sees the keys j <= p.

   Flash attention, arranged for a CPU's vectors: a tile of 16 query positions of one query head is one 512-bit
   vector per head dimension (the queries transposed once per tile), so a key's 16 scores come out as one vector
   (16 query lanes) from D fused multiply-adds with that key's elements broadcast from its row in place, and the
   online softmax (running maximum, rescale, sum) runs across the lanes with no horizontal operation. Keys are taken
   in blocks of KB; the G query heads that share a KV head reuse each block while it is in L1. The output of a tile
   is one vector of its lanes per head dimension, rescaled once per block, divided by the softmax's sum at the end.
   Blocks past a tile's last query position are never computed (causal), and only the blocks that reach its first
   position are masked.

   float32: FMAs in float32 (AVX-512F; on AVX2 the same in tiles of 8, prefill_attention_avx2.h). A chunk of more
   queries than one vector's lanes runs tiles of two vectors (32 on AVX-512, 16 on AVX2), each broadcast element
   feeding both. bfloat16 (AVX512-BF16, with AVX512BW): the
   products run on `vdpbf16ps`, 32 bfloat16 pairs into 16 float32 sums an instruction, twice the multiplies of a float32
   FMA: scores over pairs of head dimensions (q's pairs transposed once per tile, k's pairs broadcast from the row), the
   weighted sum of V over pairs of keys (the softmax's probabilities rounded to bfloat16, as torch's CPU flash kernel
   rounds them before its second GEMM; V's rows interleaved in pairs once per call). Softmax, maxima and sums in
   float32; exp is a polynomial within ~2 float32 ulps of expf (inputs below -87 give exp(-87), ~1.6e-38: nothing beside
   a maximum's 1).
   Sums run in another order than SDPA's: values are not bit-identical to torch's (within float32 rounding;
   bfloat16: within the rounding of the probabilities and of the output), greedy tokens are
   (tests/inference/engine/test_prefill_attention.py).

   No -march: target attributes, picked at run time. tandem_prefill_attention_isa() says 1 where the CPU has AVX2
   with FMA (float32 in 256-bit vectors), 2 where it has AVX-512F (float32), 3 where it
   also has AVX512-BF16 and AVX512BW (bfloat16 too), 0 otherwise (the engine keeps torch's SDPA). */
#include "kernels.h"

static int isa = -1;
static int detect(void) {  /* kernels.h's 0 / 1 (AVX2 with FMA) / 2 (AVX-512F), and 3: AVX-512F with BF16 and BW */
    int found = detected_isa();
    return found == 2 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") ? 3 : found;
}
int tandem_prefill_attention_isa(void) {
    if (isa < 0) isa = detect();
    return isa;
}
int tandem_prefill_attention_cap_isa(int max) {
    int found = detect();
    isa = found < max ? found : max;
    return isa;
}

#define LANES 16  /* query positions of a tile on AVX-512: one 512-bit vector of float32 */
#define LANES32 32 /* float32 on AVX-512 for chunks of more than LANES: two vectors (each key's loads feed twice the FMAs) */
#define LANES8 8  /* on AVX2: one 256-bit vector */
#define KB 64     /* keys of a block */
#define KG 8      /* keys whose scores are computed at once (KG accumulators) */
#define DG 16     /* head dimensions of the output updated at once (DG accumulators; AVX2: DG8, in 16 registers) */
#define DG8 8
#define MAX_D 256

typedef int32_t __attribute__((may_alias)) i32a;

/* The row's address as the compiler cannot take apart: its DG elements are then read at displacements from one
   register, not from DG offsets (d0 + u) hoisted out of the loop over keys, which spilled registers (seen in perf). */
#define OPAQUE(ptr) __asm__("" : "+r"(ptr))

/* The calling thread's int32 scratch for V's interleaved pairs (bfloat16), beside kernels.h's float scratch. */
TANDEM_THREAD_BUFFER(pair_scratch, int32_t)

/* What one task (a KV head, a tile of LANES query positions) reads. */
typedef struct {
    int dtype;
    const char *q;         /* the chunk's queries [C, ld_q] */
    int64_t ld_q;          /* elements from one query position's row to the next */
    char *out;             /* [C, ld_o] */
    int64_t ld_o;
    int64_t C, first;      /* queries, position of the first */
    const char *k, *v;     /* key position j's rows: k + slots[j] * ld_k elements, v + slots[j] * ld_v */
    const int64_t *slots;
    int64_t ld_k, ld_v;
    const int32_t *vpairs; /* bfloat16: [Hkv, ceil(S / 2), D] V's rows interleaved in pairs of keys */
    int64_t S, Hkv, G, D;
    float scale;
} Call;

/* Per tile and query head: the queries transposed ([D][LANES] floats, or [D/2][LANES] bfloat16 pairs), the
   output [D][LANES], the running maximum and sum [LANES]; per block: scores [KB][LANES], probabilities. */
typedef struct {
    float *qt, *o, *m, *l;
} State;

/* Query head g's state in a task's scratch: per_head floats a head ((2 * D + 2) * L), one after another. */
static inline State state_of(float *scratch, size_t per_head, int64_t g, int64_t D, int L) {
    float *base = scratch + per_head * (size_t)g;
    return (State){base, base + D * L, base + 2 * D * L, base + 2 * D * L + L};
}

/* ---- scores: KG keys (or fewer) x LANES queries ---------------------------------------------------------------- */

__attribute__((target("avx512f"), always_inline))
static inline void scores_f32(const float *qt, const float *const *rows, int n, int64_t D, __m512 *out) {
    __m512 acc[KG];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m512 qd = _mm512_loadu_ps(qt + d * LANES);
        _Pragma("GCC unroll 8")
        for (int t = 0; t < KG; t++)
            if (t < n) acc[t] = _mm512_fmadd_ps(qd, _mm512_set1_ps(rows[t][d]), acc[t]);
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG; t++)
        if (t < n) out[t] = acc[t];
}

__attribute__((target("avx512f,avx512bf16,avx512bw"), always_inline))
static inline void scores_bf16(const float *qt, const uint16_t *const *rows, int n, int64_t D, __m512 *out) {
    __m512 acc[KG];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < D / 2; p++) {
        __m512bh qp = (__m512bh)_mm512_loadu_si512((const void *)(qt + p * LANES));
        _Pragma("GCC unroll 8")
        for (int t = 0; t < KG; t++)
            if (t < n)
                acc[t] = _mm512_dpbf16_ps(acc[t], qp, (__m512bh)_mm512_set1_epi32(((const i32a *)rows[t])[p]));
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG; t++)
        if (t < n) out[t] = acc[t];
}

/* ---- one block of keys for one query head ---------------------------------------------------------------------- */

/* Scores of keys [j0, j0 + kb) into s[j][LANES] (scaled, masked past each lane's position), then the online softmax:
   the running maximum and sum updated, s turned into probabilities, the output rescaled and added to. */
#define BLOCK_BODY(SCORES, ROW_T, ROWS)                                                                               \
    const __m512 scale = _mm512_set1_ps(c->scale);                                                                  \
    const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32((int)(c->first + i0)),                                  \
                                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)); \
    const int masked = j0 + kb - 1 > c->first + i0;                                                                  \
    __m512 bmax = _mm512_set1_ps(-INFINITY);                                                                        \
    for (int j = 0; j < kb; j += KG) {                                                                              \
        int n = kb - j < KG ? kb - j : KG;                                                                          \
        __m512 sc[KG];                                                                                              \
        if (n == KG) SCORES(st->qt, (const ROW_T *const *)(ROWS) + j, KG, c->D, sc);                               \
        else SCORES(st->qt, (const ROW_T *const *)(ROWS) + j, n, c->D, sc);                                        \
        for (int t = 0; t < n; t++) {                                                                               \
            __m512 x = _mm512_mul_ps(sc[t], scale);                                                                \
            if (masked) {                                                                                           \
                __mmask16 visible = _mm512_cmp_epi32_mask(_mm512_set1_epi32((int)(j0 + j + t)), pos, _MM_CMPINT_LE); \
                x = _mm512_mask_blend_ps(visible, _mm512_set1_ps(-INFINITY), x);                                   \
            }                                                                                                       \
            bmax = _mm512_max_ps(bmax, x);                                                                          \
            _mm512_storeu_ps(s + (j + t) * LANES, x);                                                              \
        }                                                                                                           \
    }                                                                                                               \
    __m512 m_old = _mm512_loadu_ps(st->m), m_new = _mm512_max_ps(m_old, bmax);                                     \
    __m512 alpha = exp_512(_mm512_sub_ps(m_old, m_new)), sum = _mm512_setzero_ps();                                \
    for (int j = 0; j < kb; j++) {                                                                                  \
        __m512 p = exp_512(_mm512_sub_ps(_mm512_loadu_ps(s + j * LANES), m_new));                                  \
        sum = _mm512_add_ps(sum, p);                                                                                \
        _mm512_storeu_ps(s + j * LANES, p);                                                                        \
    }                                                                                                               \
    _mm512_storeu_ps(st->m, m_new);                                                                                 \
    _mm512_storeu_ps(st->l, _mm512_fmadd_ps(_mm512_loadu_ps(st->l), alpha, sum));

__attribute__((target("avx512f")))
static void block_f32(const Call *c, State *st, const float *const *krows, const float *const *vrows, int64_t i0,
                      int64_t j0, int kb, float *s) {
    BLOCK_BODY(scores_f32, float, krows)
    for (int64_t d0 = 0; d0 < c->D; d0 += DG) {
        __m512 acc[DG];
        _Pragma("GCC unroll 16")
        for (int u = 0; u < DG; u++) acc[u] = _mm512_mul_ps(_mm512_loadu_ps(st->o + (d0 + u) * LANES), alpha);
        for (int j = 0; j < kb; j++) {
            __m512 p = _mm512_loadu_ps(s + j * LANES);
            const float *row = vrows[j] + d0;
            OPAQUE(row);
            _Pragma("GCC unroll 16")
            for (int u = 0; u < DG; u++) acc[u] = _mm512_fmadd_ps(p, _mm512_set1_ps(row[u]), acc[u]);
        }
        _Pragma("GCC unroll 16")
        for (int u = 0; u < DG; u++) _mm512_storeu_ps(st->o + (d0 + u) * LANES, acc[u]);
    }
}

__attribute__((target("avx512f,avx512bf16,avx512bw")))
static void block_bf16(const Call *c, State *st, const uint16_t *const *krows, const int32_t *vpairs, int64_t i0,
                       int64_t j0, int kb, float *s, int32_t *ppairs) {
    BLOCK_BODY(scores_bf16, uint16_t, krows)
    /* probabilities of keys 2jp and 2jp + 1 as one bfloat16 pair per lane (an odd block's last pair with 0) */
    const __m512i interleave = _mm512_setr_epi32(0x00100000, 0x00110001, 0x00120002, 0x00130003, 0x00140004,
                                                 0x00150005, 0x00160006, 0x00170007, 0x00180008, 0x00190009,
                                                 0x001a000a, 0x001b000b, 0x001c000c, 0x001d000d, 0x001e000e,
                                                 0x001f000f);
    int pairs = (kb + 1) / 2;
    for (int jp = 0; jp < pairs; jp++) {
        __m512 a = _mm512_loadu_ps(s + 2 * jp * LANES);
        __m512 b = 2 * jp + 1 < kb ? _mm512_loadu_ps(s + (2 * jp + 1) * LANES) : _mm512_setzero_ps();
        __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);  /* a's 16 in the low half, b's in the high */
        _mm512_storeu_si512((void *)(ppairs + jp * LANES), _mm512_permutexvar_epi16(interleave, both));
    }
    for (int64_t d0 = 0; d0 < c->D; d0 += DG) {
        __m512 acc[DG];
        _Pragma("GCC unroll 16")
        for (int u = 0; u < DG; u++) acc[u] = _mm512_mul_ps(_mm512_loadu_ps(st->o + (d0 + u) * LANES), alpha);
        for (int jp = 0; jp < pairs; jp++) {
            __m512bh p = (__m512bh)_mm512_loadu_si512((const void *)(ppairs + jp * LANES));
            const int32_t *row = vpairs + (j0 / 2 + jp) * c->D + d0;
            _Pragma("GCC unroll 16")
            for (int u = 0; u < DG; u++) acc[u] = _mm512_dpbf16_ps(acc[u], p, (__m512bh)_mm512_set1_epi32(row[u]));
        }
        _Pragma("GCC unroll 16")
        for (int u = 0; u < DG; u++) _mm512_storeu_ps(st->o + (d0 + u) * LANES, acc[u]);
    }
}

/* ---- float32 on AVX-512, tiles of LANES32 query positions in two vectors ----------------------------------------
   The same steps as block_f32; each broadcast element of a key's or a value's row feeds two FMAs (the tile's two
   halves), so the loads per FMA fall from ~1.1 to ~0.6 (one 512-bit load port less busy than the two FMA ports on an
   Intel core, where block_f32 ran well below the matmul peak). */

#define KG2 8  /* keys whose scores are computed at once: 2 x KG2 accumulators */
#define DG2 8  /* head dimensions of the output updated at once: 2 x DG2 accumulators */

__attribute__((target("avx512f"), always_inline))
static inline void scores_f32x2(const float *qt, const float *const *rows, int n, int64_t D, __m512 *lo, __m512 *hi) {
    __m512 a[KG2], b[KG2];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG2; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m512 q0 = _mm512_loadu_ps(qt + d * LANES32), q1 = _mm512_loadu_ps(qt + d * LANES32 + LANES);
        _Pragma("GCC unroll 8")
        for (int t = 0; t < KG2; t++)
            if (t < n) {
                __m512 k = _mm512_set1_ps(rows[t][d]);
                a[t] = _mm512_fmadd_ps(q0, k, a[t]);
                b[t] = _mm512_fmadd_ps(q1, k, b[t]);
            }
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < KG2; t++)
        if (t < n) lo[t] = a[t], hi[t] = b[t];
}

__attribute__((target("avx512f")))
static void block_f32x2(const Call *c, State *st, const float *const *krows, const float *const *vrows, int64_t i0,
                        int64_t j0, int kb, float *s) {
    const __m512 scale = _mm512_set1_ps(c->scale), hidden_value = _mm512_set1_ps(-INFINITY);
    const __m512i pos0 = _mm512_add_epi32(_mm512_set1_epi32((int)(c->first + i0)),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i pos1 = _mm512_add_epi32(pos0, _mm512_set1_epi32(LANES));
    const int masked = j0 + kb - 1 > c->first + i0;
    __m512 max0 = hidden_value, max1 = hidden_value;
    for (int j = 0; j < kb; j += KG2) {
        int n = kb - j < KG2 ? kb - j : KG2;
        __m512 lo[KG2], hi[KG2];
        if (n == KG2) scores_f32x2(st->qt, krows + j, KG2, c->D, lo, hi);
        else scores_f32x2(st->qt, krows + j, n, c->D, lo, hi);
        for (int t = 0; t < n; t++) {
            __m512 x0 = _mm512_mul_ps(lo[t], scale), x1 = _mm512_mul_ps(hi[t], scale);
            if (masked) {  /* key j0 + j + t past a lane's position: -inf */
                __m512i key = _mm512_set1_epi32((int)(j0 + j + t));
                x0 = _mm512_mask_blend_ps(_mm512_cmp_epi32_mask(key, pos0, _MM_CMPINT_LE), hidden_value, x0);
                x1 = _mm512_mask_blend_ps(_mm512_cmp_epi32_mask(key, pos1, _MM_CMPINT_LE), hidden_value, x1);
            }
            max0 = _mm512_max_ps(max0, x0);
            max1 = _mm512_max_ps(max1, x1);
            _mm512_storeu_ps(s + (j + t) * LANES32, x0);
            _mm512_storeu_ps(s + (j + t) * LANES32 + LANES, x1);
        }
    }
    __m512 m_old0 = _mm512_loadu_ps(st->m), m_new0 = _mm512_max_ps(m_old0, max0);
    __m512 m_old1 = _mm512_loadu_ps(st->m + LANES), m_new1 = _mm512_max_ps(m_old1, max1);
    __m512 alpha0 = exp_512(_mm512_sub_ps(m_old0, m_new0)), alpha1 = exp_512(_mm512_sub_ps(m_old1, m_new1));
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (int j = 0; j < kb; j++) {
        __m512 p0 = exp_512(_mm512_sub_ps(_mm512_loadu_ps(s + j * LANES32), m_new0));
        __m512 p1 = exp_512(_mm512_sub_ps(_mm512_loadu_ps(s + j * LANES32 + LANES), m_new1));
        sum0 = _mm512_add_ps(sum0, p0);
        sum1 = _mm512_add_ps(sum1, p1);
        _mm512_storeu_ps(s + j * LANES32, p0);
        _mm512_storeu_ps(s + j * LANES32 + LANES, p1);
    }
    _mm512_storeu_ps(st->m, m_new0);
    _mm512_storeu_ps(st->m + LANES, m_new1);
    _mm512_storeu_ps(st->l, _mm512_fmadd_ps(_mm512_loadu_ps(st->l), alpha0, sum0));
    _mm512_storeu_ps(st->l + LANES, _mm512_fmadd_ps(_mm512_loadu_ps(st->l + LANES), alpha1, sum1));
    for (int64_t d0 = 0; d0 < c->D; d0 += DG2) {
        __m512 a[DG2], b[DG2];
        _Pragma("GCC unroll 8")
        for (int u = 0; u < DG2; u++) {
            a[u] = _mm512_mul_ps(_mm512_loadu_ps(st->o + (d0 + u) * LANES32), alpha0);
            b[u] = _mm512_mul_ps(_mm512_loadu_ps(st->o + (d0 + u) * LANES32 + LANES), alpha1);
        }
        for (int j = 0; j < kb; j++) {
            __m512 p0 = _mm512_loadu_ps(s + j * LANES32), p1 = _mm512_loadu_ps(s + j * LANES32 + LANES);
            const float *row = vrows[j] + d0;
            OPAQUE(row);
            _Pragma("GCC unroll 8")
            for (int u = 0; u < DG2; u++) {
                __m512 v = _mm512_set1_ps(row[u]);
                a[u] = _mm512_fmadd_ps(p0, v, a[u]);
                b[u] = _mm512_fmadd_ps(p1, v, b[u]);
            }
        }
        _Pragma("GCC unroll 8")
        for (int u = 0; u < DG2; u++) {
            _mm512_storeu_ps(st->o + (d0 + u) * LANES32, a[u]);
            _mm512_storeu_ps(st->o + (d0 + u) * LANES32 + LANES, b[u]);
        }
    }
}

#include "prefill_attention_avx2.h"

/* ---- one task: a KV head's G query heads over a tile of query positions ---------------------------------------- */

/* The block a call's tiles run, and its tile's query positions (lanes). */
enum { F32_ONE, F32_TWO, F32_ONE_AVX2, F32_TWO_AVX2, BF16_ONE };
static const int LANES_OF[] = {LANES, LANES32, LANES8, LANES16, LANES};

static int task(const Call *c, int64_t h, int64_t i0, int kind) {
    const int L = LANES_OF[kind];
    const int64_t D = c->D, G = c->G, lanes = c->C - i0 < L ? c->C - i0 : L;
    const size_t esize = dtype_size(c->dtype);
    /* scratch: per head qt, o [D * L] and m, l [L]; s [KB * L]; pairs [KB / 2 * L]; row pointers */
    size_t per_head = (size_t)(2 * D + 2) * L;
    float *scratch = thread_scratch(per_head * (size_t)G + (KB + KB / 2) * L + 2 * KB * 2);
    if (!scratch) return -2;
    float *s = scratch + per_head * (size_t)G;
    int32_t *ppairs = (int32_t *)(s + KB * L);
    const void **krows = (const void **)(ppairs + KB / 2 * L), **vrows = krows + KB;
    for (int64_t g = 0; g < G; g++) {
        State st = state_of(scratch, per_head, g, D, L);
        int64_t head = h * G + g;
        memset(st.qt, 0, sizeof(float) * (size_t)(2 * D * L));
        for (int i = 0; i < L; i++) {
            st.m[i] = -INFINITY;
            st.l[i] = 0.0f;
        }
        for (int64_t i = 0; i < lanes; i++) {
            const char *row = c->q + ((i0 + i) * c->ld_q + head * D) * (int64_t)esize;
            if (c->dtype == DT_F32)
                for (int64_t d = 0; d < D; d++) st.qt[d * L + i] = ((const float *)row)[d];
            else
                for (int64_t p = 0; p < D / 2; p++) ((int32_t *)st.qt)[p * L + i] = ((const i32a *)row)[p];
        }
    }
    int64_t last = c->first + i0 + lanes - 1;  /* the tile's last query position: keys 0 .. last */
    for (int64_t j0 = 0; j0 <= last; j0 += KB) {
        int kb = (int)(last + 1 - j0 < KB ? last + 1 - j0 : KB);
        for (int j = 0; j < kb; j++) {
            krows[j] = c->k + (c->slots[j0 + j] * c->ld_k + h * D) * (int64_t)esize;
            vrows[j] = c->v + (c->slots[j0 + j] * c->ld_v + h * D) * (int64_t)esize;
        }
        for (int64_t g = 0; g < G; g++) {
            State st = state_of(scratch, per_head, g, D, L);
            const float *const *kf = (const float *const *)krows, *const *vf = (const float *const *)vrows;
            switch (kind) {
            case F32_ONE: block_f32(c, &st, kf, vf, i0, j0, kb, s); break;
            case F32_TWO: block_f32x2(c, &st, kf, vf, i0, j0, kb, s); break;
            case F32_ONE_AVX2: block_f32_avx2(c, &st, kf, vf, i0, j0, kb, s); break;
            case F32_TWO_AVX2: block_f32x2_avx2(c, &st, kf, vf, i0, j0, kb, s); break;
            default:
                block_bf16(c, &st, (const uint16_t *const *)krows, c->vpairs + h * ((c->S + 1) / 2) * D, i0, j0, kb,
                           s, ppairs);
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        State st = state_of(scratch, per_head, g, D, L);
        int64_t head = h * G + g;
        for (int64_t i = 0; i < lanes; i++) {
            float inv = 1.0f / st.l[i];
            char *row = c->out + ((i0 + i) * c->ld_o + head * D) * (int64_t)esize;
            for (int64_t d = 0; d < D; d++) store_scalar(c->dtype, row, d, st.o[d * L + i] * inv);
        }
    }
    return 0;
}

/* V's rows of every KV head interleaved in pairs of keys: out[h][jp][d] = (v[2jp][h][d], v[2jp + 1][h][d]) as one
   32-bit pair (the low half the even key's), an odd S's last pair with 0. */
__attribute__((target("avx512f,avx512bw")))
static void pair_values(const Call *c, int32_t *out) {
    const int64_t D = c->D, pairs = (c->S + 1) / 2;
    const __m512i lo = _mm512_setr_epi32(0x00200000, 0x00210001, 0x00220002, 0x00230003, 0x00240004, 0x00250005,
                                         0x00260006, 0x00270007, 0x00280008, 0x00290009, 0x002a000a, 0x002b000b,
                                         0x002c000c, 0x002d000d, 0x002e000e, 0x002f000f);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t h = 0; h < c->Hkv; h++)
        for (int64_t jp = 0; jp < pairs; jp++) {
            const uint16_t *a = (const uint16_t *)c->v + c->slots[2 * jp] * c->ld_v + h * D;
            const uint16_t *b = 2 * jp + 1 < c->S ? (const uint16_t *)c->v + c->slots[2 * jp + 1] * c->ld_v + h * D
                                                  : NULL;
            int32_t *dst = out + (h * pairs + jp) * D;
            int64_t d = 0;
            for (; d + 32 <= D; d += 32) {
                __m512i x = _mm512_loadu_si512((const void *)(a + d));
                __m512i y = b ? _mm512_loadu_si512((const void *)(b + d)) : _mm512_setzero_si512();
                _mm512_storeu_si512((void *)(dst + d), _mm512_permutex2var_epi16(x, lo, y));
                _mm512_storeu_si512((void *)(dst + d + 16), _mm512_permutex2var_epi16(x, hi, y));
            }
            for (; d < D; d++) dst[d] = (int32_t)((uint32_t)a[d] | (uint32_t)(b ? b[d] : 0) << 16);
        }
}

/* out[i * ld_o + (h * G + g) * D + d] for the C queries q[i * ld_q + ...] at positions first + i, over the keys
   0 .. first + C - 1 (rows k + slots[j] * ld_k and v + slots[j] * ld_v); q, out, k, v all of `dtype` (0 float32,
   1 bfloat16).
   Returns 0; -1 when the CPU lacks the instruction set for `dtype` (nothing written); -2 when scratch cannot grow;
   -3 for a shape it does not take (D not a multiple of 16 or over 256, Hq not a multiple of Hkv, C < 1 or
   first < 0). */
int tandem_prefill_attention(int dtype, const void *q, int64_t ld_q, void *out, int64_t ld_o, int64_t C,
                             int64_t first, const void *k, int64_t ld_k, const void *v, int64_t ld_v,
                             const int64_t *slots,
                             int64_t Hq, int64_t Hkv, int64_t D, float scale, int num_threads) {
    int have = tandem_prefill_attention_isa();
    if (have < 1 || (dtype == DT_BF16 && have < 3) || (dtype != DT_F32 && dtype != DT_BF16)) return -1;
    /* two vectors a tile where a chunk fills more than one (float32) */
    const int kind = dtype == DT_BF16 ? BF16_ONE : have < 2 ? (C > LANES8 ? F32_TWO_AVX2 : F32_ONE_AVX2)
                                                            : (C > LANES ? F32_TWO : F32_ONE);
    const int L = LANES_OF[kind];
    if (D % 16 || D > MAX_D || Hkv < 1 || Hq % Hkv || C < 1 || first < 0) return -3;
    Call c = {dtype, q, ld_q, out, ld_o, C, first, k, v, slots, ld_k, ld_v, NULL, first + C, Hkv, Hq / Hkv, D, scale};
    if (dtype == DT_BF16) {
        int32_t *pairs = pair_scratch((size_t)(Hkv * ((c.S + 1) / 2) * D));
        if (!pairs) return -2;
        pair_values(&c, pairs);
        c.vpairs = pairs;
    }
    int64_t tiles = (C + L - 1) / L, tasks = Hkv * tiles;
    int failed = 0;
    /* the later tiles have more keys: dynamic, the longest first */
    #pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1 && tasks > 1) \
        reduction(| : failed)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t tile = tiles - 1 - t / Hkv, h = t % Hkv;
        failed |= task(&c, h, tile * L, kind) != 0;
    }
    return failed ? -2 : 0;
}
