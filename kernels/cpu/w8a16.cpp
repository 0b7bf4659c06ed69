// structserve_cpu::w8a16_linear: y = (x @ W.T) * scale for a few rows of float32 x, W held as int8
// per output channel with a bf16 scale per row (engine/models/quantized_tensor.py's Int8Channels),
// x split per group of 32 into two int8 levels (a first quantization and the quantization of its
// rounding residual, about 15 bits in all), the products summed with AVX512-VNNI (vpdpbusd).
// Specification and layout: kernels/w8a16_linear.py (`w8a16_linear_ref`, `pack_w8a16`).
//
// Layout: weight rows in blocks of 16, one int32 lane of vpdpbusd per row. For block b and input
// quad j (inputs 4j .. 4j + 3) a 64-byte vector whose byte 4r + t holds row 16b + r's input 4j + t
// plus 128 (vpdpbusd multiplies unsigned by signed bytes); a block is K / 4 such vectors in input
// order. Scales are [blocks, 16] bf16.
//
// Per group g of a row, level l (l = 1, 2) with int8 values q_l, step s_l:
//   sum_i w_i q_li = sum_i (w_i + 128) q_li - 128 * sum_i q_li,
// the second term set as the accumulator's start, so the integer sum is exact; the row's result is
// scale * sum_g (s_1g * dot_1g + s_2g * dot_2g). Every (x row, weight row) pair goes through the same
// operations whatever M is and however the blocks are split between threads, so a row's result
// never depends on the batch it came in.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vnni_rows.h"
#include "w8a16_frame.h"

namespace {

using namespace structserve_cpu;

constexpr int64_t kVector = 64;   // bytes per packed vector: 16 rows x 4 inputs
constexpr int kLevels = 2;        // int8 levels per activation: the value and its rounding residual

// One x row as two int8 levels: per level its int8 values in input order, and per group the step
// and -128 * (sum of the int8 values), the accumulator's start.
struct TwoLevelRow {
  const int8_t* q[kLevels];        // [K] each
  const float* step[kLevels];      // [K / 32] each
  const int32_t* start[kLevels];   // [K / 32] each
};

// Quantizes x[0..K) into the buffers of one TwoLevelRow: level 1 quantizes x, level 2 quantizes
// x - q1 * s1 (float32, rounded after the product and after the difference, as the reference).
void quantize_two_levels(const float* x, int64_t K, int8_t* q1, int8_t* q2, float* s1, float* s2, int32_t* start1,
                         int32_t* start2) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    const __m512 lo = _mm512_loadu_ps(xg), hi = _mm512_loadu_ps(xg + 16);
    const GroupQuant first = quantize_group(lo, hi, q1 + g * kGroup);
    const __m512 step = _mm512_set1_ps(first.step);
    const __m512 rlo = _mm512_sub_ps(lo, _mm512_mul_ps(_mm512_cvtepi32_ps(first.qlo), step));
    const __m512 rhi = _mm512_sub_ps(hi, _mm512_mul_ps(_mm512_cvtepi32_ps(first.qhi), step));
    const GroupQuant second = quantize_group(rlo, rhi, q2 + g * kGroup);
    s1[g] = first.step;
    s2[g] = second.step;
    start1[g] = -128 * first.qsum;
    start2[g] = -128 * second.qsum;
  }
}

// The 16 outputs of weight block `w` (K / 4 vectors) for MR rows of x, times the block's scales,
// stored to y[m * ldy + 0..15] (`lanes` of them: fewer in a last, partial block). With one x row
// each level's dot product runs as two chains (even and odd vectors) to keep the unit busy; with
// more, the rows' chains are independent already and one chain each keeps them in registers.
template <int MR>
inline void block_dot(const uint8_t* w, const uint16_t* scales, const TwoLevelRow* x, int64_t K, float* y,
                      int64_t ldy, __mmask16 lanes) {
  constexpr int kChains = MR == 1 ? 2 : 1;
  __m512 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m512i dot[MR][kLevels][kChains];
    for (int m = 0; m < MR; ++m) {
      for (int l = 0; l < kLevels; ++l) {
        dot[m][l][0] = _mm512_set1_epi32(x[m].start[l][g]);
        if constexpr (kChains == 2) dot[m][l][1] = _mm512_setzero_si512();
      }
    }
    for (int o = 0; o < kGroup / 4; ++o) {
      const __m512i v = _mm512_loadu_si512(w + (g * (kGroup / 4) + o) * kVector);
      for (int m = 0; m < MR; ++m) {
        for (int l = 0; l < kLevels; ++l) {
          __m512i& chain = dot[m][l][o % kChains];
          chain = _mm512_dpbusd_epi32(chain, v, broadcast4(x[m].q[l] + g * kGroup + o * 4));
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      for (int l = 0; l < kLevels; ++l) {
        __m512i sum = dot[m][l][0];
        if constexpr (kChains == 2) sum = _mm512_add_epi32(sum, dot[m][l][1]);
        const __m512 d = _mm512_cvtepi32_ps(sum);
        acc[m] = _mm512_fmadd_ps(d, _mm512_set1_ps(x[m].step[l][g]), acc[m]);
      }
    }
  }
  const __m512 scale = bf16_line(scales);
  for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + m * ldy, lanes, _mm512_mul_ps(acc[m], scale));
}

at::Tensor w8a16_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t N) {
  check_w8a16_args(x, packed, scales, N);
  const int64_t M = x.size(0), K = x.size(1), blocks = (N + kBlock - 1) / kBlock;
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const int64_t groups = K / kGroup;
  std::vector<int8_t> q(static_cast<size_t>(M * kLevels * K));
  std::vector<float> steps(static_cast<size_t>(M * kLevels * groups));
  std::vector<int32_t> starts(static_cast<size_t>(M * kLevels * groups));
  std::vector<TwoLevelRow> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    int8_t* qm = q.data() + m * kLevels * K;
    float* sm = steps.data() + m * kLevels * groups;
    int32_t* tm = starts.data() + m * kLevels * groups;
    rows[m] = TwoLevelRow{{qm, qm + K}, {sm, sm + groups}, {tm, tm + groups}};
    quantize_two_levels(xc.data_ptr<float>() + m * K, K, qm, qm + K, sm, sm + groups, tm, tm + groups);
  }
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  float* out = y.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint8_t* wb = w + b * K * kBlock;
      const int64_t n0 = b * kBlock, valid = std::min(kBlock, N - n0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << valid) - 1);
      for_row_tiles(M, [&](auto mr, int64_t m) {
        block_dot<decltype(mr)::value>(wb, s + b * kBlock, rows.data() + m, K, out + m * N + n0, N, lanes);
      });
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {
  m.def("w8a16_linear(Tensor x, Tensor packed, Tensor scales, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("w8a16_linear", &w8a16_linear); }
