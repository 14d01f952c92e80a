/* A step's layers in one C call (inference/engine/decode_layers.py builds the plan and calls it): its decode rows,
   and the prompt rows of a few tokens beside them (a mixed chunked step) or alone.

   The lean forward (lean_decode.py) runs each layer as ~25 tensor ops and 5-7 kernel calls from Python; at one token
   a sequence each op costs more in dispatch than in arithmetic (in a small model's step the ops and call overhead
   are a sizeable share beside the weight reads). Here the same layer runs in C, calling the same kernels
   through the function pointers the plan holds (tandem_matvec, tandem_int8_matvec, tandem_paged_attention: each
   from its own library), with the elementwise steps between them written out:

     qkv = projection(rms_norm(x))            the kernels normalize on the way in
     q, k = rope(q, k); cache[slot] = k, v    x * cos + roll(x, D/2) * sin', sin' with its first half negated
     o = attention(q, cache)                  the prefill kernel for prompt rows, the paged kernel for decode rows
     x = x + o_proj(o)
     g, u = projection(rms_norm(x))
     x = x + down(silu(g) * u)

   Each elementwise step rounds where the lean forward's tensor op rounds (bfloat16: every product and sum is
   rounded to bfloat16, as torch's bfloat16 ops compute in float32 and round once), so the values differ from the
   lean forward's only where a math function does: silu's exp (libm's expf here, torch's vectorized exp there). */
#include "kernels.h"

/* No instructions of its own (the kernels it calls pick theirs): the ISA functions say what the CPU offers. */
TANDEM_ISA_FUNCTIONS(tandem_decode_layers)

typedef int (*matvec_fn)(int dtype, const void *W, int64_t ldw, const void *x, int64_t ldx, void *y, int64_t ldy,
                         int64_t T, int64_t N, int64_t K, const void *bias, const void *norm_w, float eps,
                         int num_threads);
typedef int (*int8_matvec_fn)(const int8_t *q, int64_t ldq, const float *scale, const float *x, int64_t ldx,
                              float *y, int64_t ldy, int64_t T, int64_t N, int64_t K, const float *bias,
                              const float *norm_w, float eps, int num_threads);
typedef int (*attention_fn)(int dtype, int kv_dtype, const void *q, void *out, const void *k_cache,
                            const void *v_cache, const int64_t *block_tables, int64_t ldt,
                            const int64_t *context_lens, int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t bs,
                            float scale, int num_threads);
typedef int (*prefill_attention_fn)(int dtype, const void *q, int64_t ld_q, void *out, int64_t ld_o, int64_t C,
                                    int64_t first, const void *k, int64_t ld_k, const void *v, int64_t ld_v,
                                    const int64_t *slots, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                                    int num_threads);

enum { CALL_MATVEC = 0, CALL_INT8 = 1 };
#define MAX_CALLS 4

/* One kernel call of a projection: `rows` outputs written from column `column` on. decode_layers.py mirrors these
   structs with ctypes. */
typedef struct {
    void *fn;
    int64_t kind;          /* CALL_MATVEC (fn: tandem_matvec, in the plan's dtype) or CALL_INT8 (tandem_int8_matvec) */
    const void *w;         /* [rows, ldw] weights (int8 for CALL_INT8) */
    int64_t ldw;
    const void *scale;     /* CALL_INT8: [rows] float32 */
    const void *bias;      /* [rows] or NULL */
    int64_t rows, column;
} Call;

/* Linears over one input as one projection [T, in] -> [T, out] (q/k/v, gate/up, or one linear), the input
   RMS-normalized first where norm_w is set. */
typedef struct {
    const void *norm_w;
    double eps;
    int64_t num_calls, in_features, out_features;
    Call calls[MAX_CALLS];
} Projection;

typedef struct {
    Projection qkv, o, gate_up, down;
    double scale;  /* the attention's */
} Layer;

typedef struct {
    int64_t dtype, num_threads;  /* the activations' dtype (DT_F32 or DT_BF16) */
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, max_tokens;
    const Layer *layers;
    void *attention;             /* tandem_paged_attention */
    void *k_cache, *v_cache;     /* [L, N, bs, Hkv, D] */
    int64_t layer_bytes, block_size;
    /* scratch, [max_tokens, ...] each in dtype: qkv [(Hq + 2 Hkv) D], q and o [Hq D], h [hidden], gu [2 I], a [I] */
    void *qkv, *q, *o, *h, *gu, *a;
    int64_t kv_dtype;            /* the cache's: dtype, or narrower (DT_BF16, DT_F16 beside DT_F32) */
    void *prefill_attention;     /* tandem_prefill_attention, or NULL: no prompt rows (a cache of dtype only) */
} Plan;

/* The prompt rows of one sequence in a step: `size` rows from `row` on, at positions first .. first + size - 1,
   attending to the cache slots of positions 0 .. first + size - 1 (`slots`, an int64 array's address). */
typedef struct {
    int64_t row, size, first, slots;
} Chunk;

static inline float rounded(int dtype, float v) { return dtype == DT_F32 ? v : bf16_to_f32(f32_to_bf16(v)); }

/* The residual adds, silu x up (exp still libm's, one at a time) and bfloat16's RoPE 16 elements at a time where the
   CPU has AVX-512F, bit for bit as the scalar loops (the same IEEE products, quotients and sums, the same roundings:
   kernels.h's round_bf16_512; float32's RoPE stays scalar, where a product and the sum after it could be fused into
   one FMA). Scalar, these loops were a visible share of a bfloat16 step of many tokens on a CPU with AVX-512. */
static int avx512 = -1;
static inline int has_avx512(void) {
    if (avx512 < 0) avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    return avx512;
}

static int project(const Plan *p, const Projection *pr, const void *x, void *y, int64_t T) {
    const size_t esize = p->dtype == DT_F32 ? 4 : 2;
    for (int64_t c = 0; c < pr->num_calls; c++) {
        const Call *call = &pr->calls[c];
        int status;
        if (call->kind == CALL_INT8)
            status = ((int8_matvec_fn)call->fn)((const int8_t *)call->w, call->ldw, (const float *)call->scale,
                                                (const float *)x, pr->in_features, (float *)y + call->column,
                                                pr->out_features, T, call->rows, pr->in_features,
                                                (const float *)call->bias, (const float *)pr->norm_w,
                                                (float)pr->eps, (int)p->num_threads);
        else
            status = ((matvec_fn)call->fn)((int)p->dtype, call->w, call->ldw, x, pr->in_features,
                                           (char *)y + (size_t)call->column * esize, pr->out_features, T, call->rows,
                                           pr->in_features, call->bias, pr->norm_w, (float)pr->eps,
                                           (int)p->num_threads);
        if (status) return status;
    }
    return 0;
}

/* RoPE on the q and k heads of each token's qkv row (q into p->q, k into its cache slot) and v into its slot:
   out[i] = x[i] * cos[i] + x[(i + D/2) % D] * sin'[i], each product and the sum rounded as the lean forward's
   tensor ops round them (`volatile`: no fused multiply-add across them); k and v rounded once more to a narrower
   cache's dtype, as the lean forward's copy into the cache rounds them. */
/* One bfloat16 head of D (a multiple of 32) elements: out[i] = round(round(x[i] cos[i]) + round(x[(i + D/2) % D]
   sin[i])), as rope_and_cache's scalar loop. */
__attribute__((target("avx512f")))
static void rope_head_bf16_512(const uint16_t *x, const uint16_t *cos, const uint16_t *sin, uint16_t *out, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < D; i += 16) {
        const int64_t rotated = i < half ? i + half : i - half;
        __m512 a = round_bf16_512(_mm512_mul_ps(load_bf16_512(x + i), load_bf16_512(cos + i)));
        __m512 b = round_bf16_512(_mm512_mul_ps(load_bf16_512(x + rotated), load_bf16_512(sin + i)));
        store_rounded_bf16_512(out + i, round_bf16_512(_mm512_add_ps(a, b)));
    }
}

static void rope_and_cache(const Plan *p, int64_t layer, int64_t T, const void *cos, const void *sin,
                           const int64_t *slots) {
    const int dtype = (int)p->dtype, kv_dtype = (int)p->kv_dtype;
    const int64_t Hq = p->num_heads, Hkv = p->num_kv_heads, D = p->head_dim, half = D / 2;
    const int64_t width = (Hq + 2 * Hkv) * D;
    char *k_layer = (char *)p->k_cache + layer * p->layer_bytes, *v_layer = (char *)p->v_cache + layer * p->layer_bytes;
    const size_t esize = dtype_size(dtype), slot_bytes = (size_t)(Hkv * D) * dtype_size(kv_dtype);
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = t * width;
        void *k_out = k_layer + (size_t)slots[t] * slot_bytes;
        for (int64_t head = 0; head < Hq + Hkv; head++) {
            const int64_t at = row + head * D;
            const int is_q = head < Hq;
            void *out = is_q ? p->q : k_out;
            const int64_t first = is_q ? (t * Hq + head) * D : (head - Hq) * D;
            if (dtype == DT_BF16 && (is_q || kv_dtype == dtype) && D % 32 == 0 && has_avx512()) {
                rope_head_bf16_512((const uint16_t *)p->qkv + at, (const uint16_t *)cos + t * D,
                                   (const uint16_t *)sin + t * D, (uint16_t *)out + first, D);
                continue;
            }
            for (int64_t i = 0; i < D; i++) {
                volatile float a = rounded(dtype, load_scalar(dtype, p->qkv, at + i) * load_scalar(dtype, cos, t * D + i));
                volatile float b = rounded(dtype, load_scalar(dtype, p->qkv, at + (i + half) % D) *
                                                      load_scalar(dtype, sin, t * D + i));
                if (is_q || kv_dtype == dtype) store_scalar(dtype, out, first + i, a + b);
                else store_scalar(kv_dtype, out, first + i, rounded(dtype, a + b));
            }
        }
        const char *v = (const char *)p->qkv + (size_t)(row + (Hq + Hkv) * D) * esize;
        char *v_out = v_layer + (size_t)slots[t] * slot_bytes;
        if (kv_dtype == dtype) memcpy(v_out, v, slot_bytes);
        else for (int64_t i = 0; i < Hkv * D; i++) store_scalar(kv_dtype, v_out, i, load_scalar(dtype, v, i));
    }
}

/* x = x + y, [T, hidden], rounded once. */
__attribute__((target("avx512f")))
static int64_t add_into_512(int dtype, void *x, const void *y, int64_t n) {  /* returns how many it added */
    int64_t i = 0;
    if (dtype == DT_F32)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps((float *)x + i, _mm512_add_ps(_mm512_loadu_ps((const float *)x + i),
                                                           _mm512_loadu_ps((const float *)y + i)));
    else if (dtype == DT_BF16)
        for (; i + 16 <= n; i += 16)
            store_rounded_bf16_512((uint16_t *)x + i, round_bf16_512(_mm512_add_ps(
                load_bf16_512((const uint16_t *)x + i), load_bf16_512((const uint16_t *)y + i))));
    return i;
}
static void add_into(int dtype, void *x, const void *y, int64_t n) {
    for (int64_t i = has_avx512() ? add_into_512(dtype, x, y, n) : 0; i < n; i++)
        store_scalar(dtype, x, i, load_scalar(dtype, x, i) + load_scalar(dtype, y, i));
}

/* a[t, i] = silu(g) * u for gu's row [g | u]: silu as torch computes it, x / (1 + exp(-x)) in float32, rounded to
   the dtype, then the product rounded. */
__attribute__((target("avx512f")))
static int64_t silu_mul_512(int dtype, const void *gu, void *a, int64_t t, int64_t I) {  /* how many it computed */
    const int bf16 = dtype == DT_BF16;
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= I; i += 16) {
        const int64_t at = t * 2 * I + i;
        __m512 g = bf16 ? load_bf16_512((const uint16_t *)gu + at) : _mm512_loadu_ps((const float *)gu + at);
        __m512 u = bf16 ? load_bf16_512((const uint16_t *)gu + at + I) : _mm512_loadu_ps((const float *)gu + at + I);
        float gs[16], es[16];
        _mm512_storeu_ps(gs, g);
        for (int j = 0; j < 16; j++) es[j] = expf(-gs[j]);  /* libm's, as the scalar loop */
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, _mm512_loadu_ps(es)));
        if (bf16)
            store_rounded_bf16_512((uint16_t *)a + t * I + i, round_bf16_512(_mm512_mul_ps(round_bf16_512(silu), u)));
        else
            _mm512_storeu_ps((float *)a + t * I + i, _mm512_mul_ps(silu, u));
    }
    return i;
}

static void silu_mul(int dtype, const void *gu, void *a, int64_t T, int64_t I) {
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = has_avx512() && dtype != DT_F16 ? silu_mul_512(dtype, gu, a, t, I) : 0; i < I; i++) {
            float g = load_scalar(dtype, gu, t * 2 * I + i), u = load_scalar(dtype, gu, t * 2 * I + I + i);
            float s = rounded(dtype, g / (1.0f + expf(-g)));
            store_scalar(dtype, a, t * I + i, s * u);
        }
    }
}

/* One layer's attention: each chunk's prompt rows through the prefill kernel over the cache (where this layer just
   wrote their K/V), then the decode rows [P, T) through the paged kernel, one row per sequence. */
static int attend(const Plan *p, int64_t l, double scale, int64_t T, int64_t num_chunks, const Chunk *chunks,
                  const int64_t *block_tables, int64_t ldt, const int64_t *context_lens) {
    const int dtype = (int)p->dtype;
    const int64_t Hq = p->num_heads, Hkv = p->num_kv_heads, D = p->head_dim;
    const size_t row_bytes = (size_t)(Hq * D) * dtype_size(dtype);
    char *k_layer = (char *)p->k_cache + l * p->layer_bytes, *v_layer = (char *)p->v_cache + l * p->layer_bytes;
    int64_t P = 0;
    for (int64_t c = 0; c < num_chunks; c++) {
        const Chunk *chunk = &chunks[c];
        int status = ((prefill_attention_fn)p->prefill_attention)(
            dtype, (char *)p->q + chunk->row * row_bytes, Hq * D, (char *)p->o + chunk->row * row_bytes, Hq * D,
            chunk->size, chunk->first, k_layer, Hkv * D, v_layer, Hkv * D, (const int64_t *)(intptr_t)chunk->slots,
            Hq, Hkv, D, (float)scale, (int)p->num_threads);
        if (status) return status;
        P += chunk->size;
    }
    if (T == P) return 0;
    return ((attention_fn)p->attention)(dtype, (int)p->kv_dtype, (char *)p->q + P * row_bytes,
                                        (char *)p->o + P * row_bytes, k_layer, v_layer, block_tables, ldt,
                                        context_lens, T - P, Hq, Hkv, D, p->block_size, (float)scale,
                                        (int)p->num_threads);
}

/* Layers [first, num_layers) over x [T, hidden] (in place) for T tokens: `num_chunks` chunks' prompt rows first (a
   chunk's rows contiguous, the chunks one after another from row 0), then one decode row per sequence; positions'
   cos and sin' [T, D] in dtype, the tokens' cache slots [T], and the decode rows' block tables (row stride ldt) and
   context lengths (this token included). Where `pause` is set, the call stops before a layer (after at least one)
   when *pause is nonzero: a request arrived, and the engine runs its prefill before the step goes on
   (interleave.py). *next_layer is then the first layer not computed, num_layers when all were. Returns 0, a kernel's
   nonzero status (nothing more computed), or -4 for T outside [1, max_tokens], first outside [0, num_layers), or
   prompt rows without a prefill kernel. */
int tandem_decode_layers(const Plan *p, void *x, int64_t T, int64_t first, int64_t num_layers, const void *cos,
                         const void *sin, const int64_t *slots, const int64_t *block_tables, int64_t ldt,
                         const int64_t *context_lens, int64_t num_chunks, const Chunk *chunks,
                         const volatile int32_t *pause, int64_t *next_layer) {
    if (T < 1 || T > p->max_tokens || first < 0 || first >= num_layers) return -4;
    if (num_chunks > 0 && !p->prefill_attention) return -4;
    const int dtype = (int)p->dtype;
    int status;
    for (int64_t l = first; l < num_layers; l++) {
        if (l > first && pause && *pause) {
            *next_layer = l;
            return 0;
        }
        const Layer *layer = &p->layers[l];
        if ((status = project(p, &layer->qkv, x, p->qkv, T))) return status;
        rope_and_cache(p, l, T, cos, sin, slots);
        if ((status = attend(p, l, layer->scale, T, num_chunks, chunks, block_tables, ldt, context_lens)))
            return status;
        if ((status = project(p, &layer->o, p->o, p->h, T))) return status;
        add_into(dtype, x, p->h, T * p->hidden);
        if ((status = project(p, &layer->gate_up, x, p->gu, T))) return status;
        silu_mul(dtype, p->gu, p->a, T, p->intermediate);
        if ((status = project(p, &layer->down, p->a, p->h, T))) return status;
        add_into(dtype, x, p->h, T * p->hidden);
    }
    *next_layer = num_layers;
    return 0;
}
