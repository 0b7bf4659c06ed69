// structserve_cpu::w4a8_linear: y = x @ W.T for a few rows of x, W held as 4-bit groups of 32 with
// a bf16 scale and zero per group (w = (q - 8) * scale + zero, q in 0..15: the tinygemm convention
// of engine/models/quantized_tensor.py), x quantized per group of 32 to int8 on the fly, the
// products summed with AVX512-VNNI (vpdpbusd: unsigned 4-bit weights x signed 8-bit activations).
// The scheme is llama.cpp's Q4_1 x Q8_1 dot product; the layout and the code are ours.
// Specification and layout: kernels/w4a8_linear.py (`w4a8_linear_ref`, `pack_w4a8`).
//
// Layout: weight rows in blocks of 16, one int32 lane of vpdpbusd per row. For block b and input
// octet j (inputs 8j .. 8j + 7) a 64-byte vector whose byte 4r + t holds row 16b + r's input
// 8j + t in its low nibble and 8j + 4 + t in its high one; a block is K / 8 such vectors in input
// order. Scales and zeros are [blocks, K / 32, 16]: one 32-byte line of bf16 per block and group.
// One vpdpbusd then adds 4 products to each of 16 rows, the 4 activation bytes broadcast, so a
// group needs 8 of them per x row and no horizontal sums: each output lane is one weight row.
//
// Per group g of a row: sum_i w_i x_i ~= scale * (step * sum_i q_i qx_i - 8 * step * sum_i qx_i)
//                                         + zero * sum_i x_i,
// with step = max |x| / 127 of the activation group and sum_i x_i its exact float sum. Every
// (x row, weight row) pair goes through the same operations whatever M is and however the rows
// are split between threads, so a row's result never depends on the batch it came in.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "vnni_rows.h"
#include "w4a8_frame.h"

namespace {

using namespace structserve_cpu;

constexpr int64_t kVector = 64;      // bytes per packed vector: 16 rows x 8 inputs

// Quantizes x[0..K) into the buffers of one QuantizedRow (2 zmm per group).
void quantize_row(const float* x, int64_t K, int8_t* qx, float* step, float* offset, float* sum) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    const __m512 lo = _mm512_loadu_ps(xg), hi = _mm512_loadu_ps(xg + 16);
    const GroupQuant q = quantize_group(lo, hi, qx + g * kGroup);
    step[g] = q.step;
    offset[g] = 8.f * q.step * static_cast<float>(q.qsum);
    sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
  }
}

// The 16 outputs of weight block `w` (K / 8 vectors) for MR rows of x, stored to y[m * ldy + 0..15]
// (`lanes` of them: fewer in a last, partial block).
template <int MR>
inline void block_dot(const uint8_t* w, const uint16_t* scales, const uint16_t* zeros, const QuantizedRow* x,
                      int64_t K, float* y, int64_t ldy, __mmask16 lanes) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m512i dot_lo[MR], dot_hi[MR];
    for (int m = 0; m < MR; ++m) dot_lo[m] = dot_hi[m] = _mm512_setzero_si512();
    for (int o = 0; o < 4; ++o) {
      const __m512i v = _mm512_loadu_si512(w + (g * 4 + o) * kVector);
      const __m512i lo = _mm512_and_si512(v, nibble);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      for (int m = 0; m < MR; ++m) {
        const int8_t* q = x[m].qx + g * kGroup + o * 8;
        dot_lo[m] = _mm512_dpbusd_epi32(dot_lo[m], lo, broadcast4(q));
        dot_hi[m] = _mm512_dpbusd_epi32(dot_hi[m], hi, broadcast4(q + 4));
      }
    }
    const __m512 scale = bf16_line(scales + g * kBlock), zero = bf16_line(zeros + g * kBlock);
    for (int m = 0; m < MR; ++m) {
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(dot_lo[m], dot_hi[m]));
      const __m512 t = _mm512_fmsub_ps(dot, _mm512_set1_ps(x[m].step[g]), _mm512_set1_ps(x[m].offset[g]));
      acc[m] = _mm512_fmadd_ps(scale, t, acc[m]);
      acc[m] = _mm512_fmadd_ps(zero, _mm512_set1_ps(x[m].sum[g]), acc[m]);
    }
  }
  for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + m * ldy, lanes, acc[m]);
}

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& zeros, int64_t N) {
  check_w4a8_args(x, packed, scales, zeros, N);
  const int64_t M = x.size(0), K = x.size(1), blocks = (N + kBlock - 1) / kBlock, groups = K / kGroup;
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const QuantizedRows rows(xc.data_ptr<float>(), M, K, quantize_row);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const auto* z = reinterpret_cast<const uint16_t*>(zeros.data_ptr());
  float* out = y.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint8_t* wb = w + b * K * 8;
      const uint16_t* sb = s + b * groups * kBlock;
      const uint16_t* zb = z + b * groups * kBlock;
      const int64_t n0 = b * kBlock, valid = std::min(kBlock, N - n0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << valid) - 1);
      for_row_tiles(M, [&](auto mr, int64_t m) {
        block_dot<decltype(mr)::value>(wb, sb, zb, rows.data() + m, K, out + m * N + n0, N, lanes);
      });
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(structserve_cpu, m) {
  m.def("w4a8_linear(Tensor x, Tensor packed, Tensor scales, Tensor zeros, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("w4a8_linear", &w4a8_linear); }
