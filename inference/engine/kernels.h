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

enum { DT_F32 = 0, DT_BF16 = 1 };

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

static inline float load_scalar(int dtype, const void *p, int64_t i) {
    return dtype == DT_F32 ? ((const float *)p)[i] : bf16_to_f32(((const uint16_t *)p)[i]);
}

static inline void store_scalar(int dtype, void *p, int64_t i, float v) {
    if (dtype == DT_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = f32_to_bf16(v);
}

/* The calling thread's float scratch, grown to at least `floats` (never shrunk, kept for the thread's life: a decode
   step makes ~120 kernel calls, and a malloc and free each was measurable); NULL when it cannot grow. Inside an OpenMP
   loop each thread has its own: hand the caller's to the loop through a plain local. */
static float *thread_scratch(size_t floats) {
    static _Thread_local float *buffer = NULL;
    static _Thread_local size_t buffer_floats = 0;
    if (floats > buffer_floats) {
        float *grown = realloc(buffer, sizeof(float) * floats);
        if (!grown) return NULL;
        buffer = grown;
        buffer_floats = floats;
    }
    return buffer;
}

#endif
