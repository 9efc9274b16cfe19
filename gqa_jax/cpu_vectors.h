// Vectors of 16 lanes for the CPU decode step's kernels (cpu_attention.cc, cpu_argmax.cc): GCC /
// Clang vector types, one AVX-512 register each (two AVX2 ones, or scalars, where the machine has
// less), loaded through memcpy so that no alignment is assumed.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gqa_jax_cpu {

typedef float f16v __attribute__((vector_size(64)));    // 16 floats
typedef int32_t i16v __attribute__((vector_size(64)));  // 16 ints: a lane mask (0 or all ones), or indices
constexpr int L = 16;  // lanes of an f16v; a head's dim is a multiple of L

template <typename T>
inline f16v load(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    f16v x;
    std::memcpy(&x, p, sizeof(x));
    return x;
  } else {
#if defined(__AVX512F__)
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    f16v r;
    std::memcpy(&r, &x, sizeof(r));
    return r;
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    f16v r;
    std::memcpy(&r, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&r) + 32, &hi, 32);
    return r;
#else
    f16v r;
    for (int i = 0; i < L; ++i) r[i] = static_cast<float>(p[i]);
    return r;
#endif
  }
}

}  // namespace gqa_jax_cpu
