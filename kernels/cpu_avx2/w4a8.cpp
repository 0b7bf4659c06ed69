// structserve_cpu::w4a8_linear for CPUs with AVX2 and FMA but not AVX512-VNNI: the operator of
// kernels/cpu/w4a8.cpp, over the same layout and the same scheme (kernels/w4a8_linear.py: 4-bit
// weight groups of 32 with a bf16 scale and zero, activations quantized per group of 32 to int8 on
// the fly; llama.cpp's Q4_1 x Q8_1 dot product), its integer dot products made with vpmaddubsw
// (unsigned 4-bit weights x signed 8-bit activations, adjacent pairs summed to int16) and vpmaddwd
// (int16 pairs summed to int32) instead of vpdpbusd. The code is ours.
//
// A 64-byte vector of the layout holds 16 weight rows x 4 bytes; AVX2 takes it as two 32-byte
// halves (rows 0-7 and 8-15), one int32 lane per weight row, so a tile is MR x rows by the 8 rows
// of one half. Within a group of 32 inputs a half's 8 vpmaddubsw products per x row are at most
// 2 x 15 x 127 = 3,810 per int16 lane each, 30,480 in all: they add up in int16 without overflow,
// and one vpmaddwd with ones widens the sum. The integer dot products are exact, as vpdpbusd's, and
// the float steps after them are the VNNI kernel's; only the float sum of each activation group is
// reduced in another order. Every (x row, weight row) pair goes through the same operations
// whatever M is and however the work is split between threads, so a row's result never depends on
// the batch it came in.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../cpu/row_tiles.h"
#include "../cpu/w4a8_frame.h"

namespace {

using structserve_cpu::for_row_tiles;
using structserve_cpu::QuantizedRow;

constexpr int64_t kGroup = structserve_cpu::kW4a8Group;
constexpr int64_t kBlock = structserve_cpu::kW4a8Block;
constexpr int64_t kHalf = 8;      // weight rows per 32-byte half: one int32 lane each
constexpr int64_t kVector = 64;   // bytes per packed vector: 16 rows x 8 inputs

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

// Quantizes x[0..K) into the buffers of one QuantizedRow: per group step = max |x| / 127 and
// qx = round-half-even(x / step) (times the inverse, as the reference), 0 for an all-zero group.
void quantize_row(const float* x, int64_t K, int8_t* qx, float* step, float* offset, float* sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  // packs interleave 128-bit lanes: the 4-byte runs come out as q0[0..3] q1[0..3] q2[0..3] q3[0..3]
  // q0[4..7] ..., and this permutation puts them back in input order
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xg + 8 * i);
    const __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude)),
                                   _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude)));
    const float s = max8(a) / 127.f;
    const __m256 inv = _mm256_set1_ps(s > 0.f ? 1.f / s : 0.f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));   // nearest even
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx + g * kGroup), _mm256_permutevar8x32_epi32(packed, order));
    const int32_t qsum = sum8i(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    step[g] = s;
    offset[g] = 8.f * s * static_cast<float>(qsum);
    sum[g] = sum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
  }
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

// The 8 outputs of one half of a weight block for MR rows of x: `w` is the half's first 32 bytes
// (its vectors kVector apart), `scales` / `zeros` the half's first bf16 of the block's group lines
// (kBlock apart); stores y[m * ldy + 0 .. valid - 1].
template <int MR>
inline void half_dot(const uint8_t* w, const uint16_t* scales, const uint16_t* zeros, const QuantizedRow* x,
                     int64_t K, float* y, int64_t ldy, int64_t valid) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m256i dot[MR];
    for (int m = 0; m < MR; ++m) dot[m] = _mm256_setzero_si256();
    for (int o = 0; o < 4; ++o) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (g * 4 + o) * kVector));
      const __m256i lo = _mm256_and_si256(v, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      for (int m = 0; m < MR; ++m) {
        const int8_t* q = x[m].qx + g * kGroup + o * 8;
        dot[m] = _mm256_add_epi16(dot[m], _mm256_maddubs_epi16(lo, broadcast4(q)));
        dot[m] = _mm256_add_epi16(dot[m], _mm256_maddubs_epi16(hi, broadcast4(q + 4)));
      }
    }
    const __m256 scale = bf16_8(scales + g * kBlock), zero = bf16_8(zeros + g * kBlock);
    for (int m = 0; m < MR; ++m) {
      const __m256 d = _mm256_cvtepi32_ps(_mm256_madd_epi16(dot[m], ones));
      const __m256 t = _mm256_fmsub_ps(d, _mm256_set1_ps(x[m].step[g]), _mm256_set1_ps(x[m].offset[g]));
      acc[m] = _mm256_fmadd_ps(scale, t, acc[m]);
      acc[m] = _mm256_fmadd_ps(zero, _mm256_set1_ps(x[m].sum[g]), acc[m]);
    }
  }
  if (valid == kHalf) {
    for (int m = 0; m < MR; ++m) _mm256_storeu_ps(y + m * ldy, acc[m]);
  } else {
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(valid)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int m = 0; m < MR; ++m) _mm256_maskstore_ps(y + m * ldy, lanes, acc[m]);
  }
}

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& zeros, int64_t N) {
  structserve_cpu::check_w4a8_args(x, packed, scales, zeros, N);
  const int64_t M = x.size(0), K = x.size(1), blocks = (N + kBlock - 1) / kBlock, groups = K / kGroup;
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const structserve_cpu::QuantizedRows rows(xc.data_ptr<float>(), M, K, quantize_row);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const auto* z = reinterpret_cast<const uint16_t*>(zeros.data_ptr());
  float* out = y.data_ptr<float>();
  // one task per half block (8 weight rows), all M rows each: the half's weights stay in L1
  at::parallel_for(0, 2 * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / 2, h = task % 2, n0 = b * kBlock + h * kHalf;
      const int64_t valid = std::min(kHalf, N - n0);
      if (valid <= 0) continue;
      const uint8_t* wh = w + b * K * 8 + h * (kVector / 2);
      const uint16_t* sh = s + b * groups * kBlock + h * kHalf;
      const uint16_t* zh = z + b * groups * kBlock + h * kHalf;
      for_row_tiles(M, [&](auto mr, int64_t m) {
        half_dot<decltype(mr)::value>(wh, sh, zh, rows.data() + m, K, out + m * N + n0, N, valid);
      });
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {
  m.def("w4a8_linear(Tensor x, Tensor packed, Tensor scales, Tensor zeros, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("w4a8_linear", &w4a8_linear); }
