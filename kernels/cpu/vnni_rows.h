// Shared parts of the VNNI kernels (w4a8.cpp, w8a16.cpp): activation rows quantized per group of 32
// to int8 on the fly, bf16 lines of 16 values and 4-byte broadcasts; the split of x rows into
// tiles is row_tiles.h's.

#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "row_tiles.h"

namespace structserve_cpu {

constexpr int64_t kGroup = 32;   // inputs per activation group (one step each)
constexpr int64_t kBlock = 16;   // weight rows per packed block: one int32 lane of vpdpbusd each

// One group of 32 activations quantized: qx = round-half-even(x / step) with step = max |x| / 127
// (qx stored as int8; step 0 and qx 0 for an all-zero group), the sum of the qx, and the qx
// themselves as int32 (two vectors of 16) for a caller that needs the rounding residual.
struct GroupQuant {
  float step;
  int32_t qsum;
  __m512i qlo, qhi;
};

inline GroupQuant quantize_group(__m512 lo, __m512 hi, int8_t* qx) {
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  const float step = amax / 127.f;
  const __m512 inv = _mm512_set1_ps(step > 0.f ? 1.f / step : 0.f);
  // round to nearest even (the default rounding mode), as torch.round
  const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
  const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qx), _mm512_cvtsepi32_epi8(qlo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qx + 16), _mm512_cvtsepi32_epi8(qhi));
  return GroupQuant{step, _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)), qlo, qhi};
}

// 16 bf16 values at p as float32.
inline __m512 bf16_line(const uint16_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// The 4 bytes at p in every int32 lane.
inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

}  // namespace structserve_cpu
