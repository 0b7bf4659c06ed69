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

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstdint>

#include "../cpu/row_tiles.h"
#include "../cpu/w4a8_frame.h"
#include "avx2_rows.h"

namespace {

using structserve_cpu::for_row_tiles;
using structserve_cpu::QuantizedRow;
using namespace structserve_cpu_avx2;

constexpr int64_t kGroup = structserve_cpu::kW4a8Group;
constexpr int64_t kBlock = structserve_cpu::kW4a8Block;
constexpr int64_t kHalf = 8;      // weight rows per 32-byte half: one int32 lane each
constexpr int64_t kVector = 64;   // bytes per packed vector: 16 rows x 8 inputs

// Quantizes x[0..K) into the buffers of one QuantizedRow (4 ymm per group).
void quantize_row(const float* x, int64_t K, int8_t* qx, float* step, float* offset, float* sum) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + g * kGroup + 8 * i);
    const GroupQuant q = quantize_group(v, qx + g * kGroup);
    step[g] = q.step;
    offset[g] = 8.f * q.step * static_cast<float>(q.qsum);
    sum[g] = sum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
  }
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
    // not unrolled: unrolled, GCC sums the 4 vectors' 32 products in another order and keeps them
    // all live, spilling about half to the stack (a row's result is the same either way: int16 sums
    // are exact here); rolled, a 248-row product ran about 15% faster on one Zen 3 thread
#pragma GCC unroll 1
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
  for (int m = 0; m < MR; ++m) store_lanes(y + m * ldy, acc[m], valid);
}

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& zeros, int64_t N) {
  structserve_cpu::check_w4a8_args(x, packed, scales, zeros, N);
  const int64_t M = x.size(0), K = x.size(1), groups = K / kGroup;
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const structserve_cpu::QuantizedRows rows(xc.data_ptr<float>(), M, K, quantize_row);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const auto* z = reinterpret_cast<const uint16_t*>(zeros.data_ptr());
  float* out = y.data_ptr<float>();
  for_half_blocks(N, [&](int64_t b, int64_t h, int64_t n0, int64_t valid) {
    const uint8_t* wh = w + b * K * 8 + h * (kVector / 2);
    const uint16_t* sh = s + b * groups * kBlock + h * kHalf;
    const uint16_t* zh = z + b * groups * kBlock + h * kHalf;
    for_row_tiles(M, [&](auto mr, int64_t m) {
      half_dot<decltype(mr)::value>(wh, sh, zh, rows.data() + m, K, out + m * N + n0, N, valid);
    });
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {
  m.def("w4a8_linear(Tensor x, Tensor packed, Tensor scales, Tensor zeros, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("w4a8_linear", &w4a8_linear); }
