/* What Tandem's C kernels share (matvec.c and the kernels beside it; native.py builds each, with this header in the
   cache key): the dtypes they read, bfloat16 conversion as torch rounds, and the instruction set picked at run time.

   No -march: each kernel names its instruction set with target attributes, and the library picks one at run time
   from what the CPU reports (AVX-512F, else AVX2 with FMA; 0 for neither: the engine keeps torch's ops). */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };  /* float16: KV caches only (paged_attention.c, decode_layers.c) */

/* 2: AVX-512F, 1: AVX2 with FMA, 0: neither. */
static int detected_isa(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 2
           : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
}

/* Defines the library's `int NAME_isa(void)`, the set it runs, and `int NAME_cap_isa(int max)`: run no wider set than
   `max` (1: AVX2, 2: AVX-512F) from now on, as ONEDNN_MAX_CPU_ISA does for oneDNN (where AVX-512 lowers the clock,
   or to check the AVX2 kernels on an AVX-512 CPU); returns the set now used. */
#define TANDEM_ISA_FUNCTIONS(NAME)                                 \
    static int isa = -1;                                           \
    int NAME##_isa(void) {                                         \
        if (isa < 0) isa = detected_isa();                         \
        return isa;                                                \
    }                                                              \
    int NAME##_cap_isa(int max) {                                  \
        int found = detected_isa();                                \
        isa = found < max ? found : max;                           \
        return isa;                                                \
    }

/* exp(x) as Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for exp(r), times 2^n. Inputs
   below -87 give exp(-87) (~1.6e-38, nothing beside a maximum's 1); NaN stays NaN. */
#define EXP_CONSTANTS                                                                                               \
    const float lo = -87.0f, log2e = 1.44269504088896341f, c1 = 0.693359375f, c2 = -2.12194440e-4f;               \
    const float p0 = 1.9875691500e-4f, p1 = 1.3981999507e-3f, p2 = 8.3334519073e-3f, p3 = 4.1665795894e-2f,        \
                p4 = 1.6666665459e-1f, p5 = 5.0000001201e-1f;

__attribute__((target("avx512f")))
static inline __m512 exp_512(__m512 x) {
    EXP_CONSTANTS
    x = _mm512_max_ps(_mm512_set1_ps(lo), x);  /* max(lo, NaN) is NaN: the second operand */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(log2e)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(c1), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(c2), r);
    __m512 p = _mm512_set1_ps(p0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

__attribute__((target("avx2,fma")))
static inline __m256 exp_256(__m256 x) {
    EXP_CONSTANTS
    x = _mm256_max_ps(_mm256_set1_ps(lo), x);  /* max(lo, NaN) is NaN: the second operand */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c2), r);
    __m256 p = _mm256_set1_ps(p0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(p5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* The sum of a vector's 8 floats (AVX2 kernels). */
__attribute__((target("avx2")))
static inline float hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, as torch's .to(torch.bfloat16) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* 16 at a time on AVX-512F, bit for bit as the scalar functions above: bfloat16 widened; float32 rounded to
   bfloat16 (nearest even, NaN kept NaN as f32_to_bf16 keeps it) and widened back; such a value narrowed (its low half
   is zero). */
__attribute__((target("avx512f"), always_inline))
static inline __m512 load_bf16_512(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
__attribute__((target("avx512f"), always_inline))
static inline __m512 round_bf16_512(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}
__attribute__((target("avx512f"), always_inline))
static inline void store_rounded_bf16_512(uint16_t *p, __m512 rounded) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rounded), 16)));
}

/* IEEE half precision, exactly (every float16 is a float32). */
static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) u = sign | 0x7f800000u | (man << 13);                       /* inf, NaN */
    else if (exp != 0) u = sign | ((exp + 112u) << 23) | (man << 13);              /* normal: bias 15 -> 127 */
    else if (man == 0) u = sign;                                                   /* zero */
    else {                                                                         /* subnormal: normalize */
        int e = -1;
        uint32_t m = man;
        do { e++; m <<= 1; } while (!(m & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 to float16, rounded to nearest even as torch's .to(torch.float16): beyond 65504 (rounded) inf, below the
   subnormals 0; NaN stays NaN. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;                                   /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;                                  /* >= 65520: inf */
    if (a < 0x38800000u) {                                                        /* below 2^-14: subnormal or 0 */
        if (a < 0x33000000u) return sign;                                         /* <= 2^-25: rounds to 0 */
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;                                           /* 14..24 */
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1u))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = ((a >> 13) - (112u << 10));                                      /* rebias, keep 10 bits */
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;                       /* may carry into the exponent */
    return sign | (uint16_t)h;
}

static inline float load_scalar(int dtype, const void *p, int64_t i) {
    return dtype == DT_F32    ? ((const float *)p)[i]
           : dtype == DT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i])
                              : f16_to_f32(((const uint16_t *)p)[i]);
}

static inline void store_scalar(int dtype, void *p, int64_t i, float v) {
    if (dtype == DT_F32) ((float *)p)[i] = v;
    else if (dtype == DT_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((uint16_t *)p)[i] = f32_to_f16(v);
}

static inline size_t dtype_size(int dtype) { return dtype == DT_F32 ? 4 : 2; }

/* Defines `static TYPE *NAME(size_t n)`: the calling thread's buffer of at least n TYPEs, grown as needed (never
   shrunk, kept for the thread's life: a decode step makes ~120 kernel calls, and a malloc and free each was
   measurable); NULL when it cannot grow. Inside an OpenMP loop each thread has its own: hand the caller's to the loop
   through a plain local. */
#define TANDEM_THREAD_BUFFER(NAME, TYPE)                          \
    static TYPE *NAME(size_t n) {                                 \
        static _Thread_local TYPE *buffer = NULL;                 \
        static _Thread_local size_t size = 0;                     \
        if (n > size) {                                           \
            TYPE *grown = realloc(buffer, sizeof(TYPE) * n);      \
            if (!grown) return NULL;                              \
            buffer = grown;                                       \
            size = n;                                             \
        }                                                         \
        return buffer;                                            \
    }

/* The calling thread's float scratch. */
TANDEM_THREAD_BUFFER(thread_scratch, float)

#endif
