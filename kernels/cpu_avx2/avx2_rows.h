// Shared parts of the AVX2 projection kernels (w4a8.cpp, w8a16.cpp): activation groups of 32
// quantized to int8 on the fly, horizontal reductions, bf16 lines of 8 values and 4-byte broadcasts.
// The AVX2 counterpart of kernels/cpu/vnni_rows.h.

#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace structserve_cpu_avx2 {

inline float max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t sum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// One group of 32 activations (4 vectors of 8) quantized: qx = round-half-even(x / step), times
// the inverse as the reference does, with step = max |x| / 127 (qx stored as int8 in input order;
// step 0 and qx 0 for an all-zero group), the sum of the qx, and the qx as int32 for a caller that
// needs the rounding residual.
struct GroupQuant {
  float step;
  int32_t qsum;
  __m256i q[4];
};

inline GroupQuant quantize_group(const __m256 v[4], int8_t* qx) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude)));
  GroupQuant out;
  out.step = max8(a) / 127.f;
  const __m256 inv = _mm256_set1_ps(out.step > 0.f ? 1.f / out.step : 0.f);
  for (int i = 0; i < 4; ++i) out.q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));   // nearest even
  // packs interleave 128-bit lanes: the 4-byte runs come out as q0[0..3] q1[0..3] q2[0..3] q3[0..3]
  // q0[4..7] ..., and the permutation puts them back in input order
  const __m256i packed =
      _mm256_packs_epi16(_mm256_packs_epi32(out.q[0], out.q[1]), _mm256_packs_epi32(out.q[2], out.q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  out.qsum = sum8i(_mm256_add_epi32(_mm256_add_epi32(out.q[0], out.q[1]), _mm256_add_epi32(out.q[2], out.q[3])));
  return out;
}

// 8 bf16 values at p as float32.
inline __m256 bf16_8(const uint16_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// The 4 bytes at p in every int32 lane.
inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Stores the first `valid` (1 .. 8) lanes of v at y.
inline void store_lanes(float* y, __m256 v, int64_t valid) {
  if (valid == 8) {
    _mm256_storeu_ps(y, v);
  } else {
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(valid)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(y, lanes, v);
  }
}

// Calls task(b, h, n0, valid) for every half h (0, 1) of every block b of 16 weight rows of an
// N-row weight, on torch's intra-op threads: n0 = 16 b + 8 h is the half's first output, `valid`
// (1 .. 8) how many of its 8 rows exist (halves wholly past N are skipped). Each task then runs
// all x rows, so the half's weights stay in L1.
template <class Task>
inline void for_half_blocks(int64_t N, Task&& task) {
  const int64_t halves = 2 * ((N + 15) / 16);
  at::parallel_for(0, halves, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n0 = 8 * i, valid = std::min<int64_t>(8, N - n0);
      if (valid > 0) task(i / 2, i % 2, n0, valid);
    }
  });
}

}  // namespace structserve_cpu_avx2
