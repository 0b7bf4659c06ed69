// The frame both w4a8_linear kernels share (kernels/cpu/w4a8.cpp with AVX512-VNNI,
// kernels/cpu_avx2/w4a8.cpp with AVX2): the operator's argument checks and the x rows quantized
// per group of 32, the quantizer itself being each kernel's own. Plain C++: no instruction set of
// its own, so both libraries include it. Layout and scheme: kernels/w4a8_linear.py.

#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

namespace structserve_cpu {

constexpr int64_t kW4a8Group = 32;   // inputs per activation group and per weight group
constexpr int64_t kW4a8Block = 16;   // weight rows per packed block

// One x row, quantized: int8 values in input order; per group the step, 8 * step * (sum of the
// int8 values) and the exact float sum.
struct QuantizedRow {
  const int8_t* qx;       // [K]
  const float* step;      // [K / 32]
  const float* offset;    // [K / 32]
  const float* sum;       // [K / 32]
};

// Checks w4a8_linear's arguments (x float32 [M, K]; the layout of pack_w4a8 for N outputs);
// raises with the layout's description otherwise.
inline void check_w4a8_args(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                            const at::Tensor& zeros, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w4a8_linear: x must be float32 [M, K]");
  const int64_t K = x.size(1), blocks = (N + kW4a8Block - 1) / kW4a8Block;
  TORCH_CHECK(K % kW4a8Group == 0, "w4a8_linear: K must be a multiple of 32, got ", K);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.size(0) == blocks &&
                  packed.size(1) == K * 8,
              "w4a8_linear: packed is uint8 [ceil(N / 16), K * 8]");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && zeros.scalar_type() == at::kBFloat16,
              "w4a8_linear: scales and zeros must be bf16");
  TORCH_CHECK(scales.dim() == 3 && scales.size(0) == blocks && scales.size(1) == K / kW4a8Group &&
                  scales.size(2) == kW4a8Block && zeros.sizes() == scales.sizes(),
              "w4a8_linear: scales and zeros are [ceil(N / 16), K / 32, 16]");
  TORCH_CHECK(packed.is_contiguous() && scales.is_contiguous() && zeros.is_contiguous(),
              "w4a8_linear: weights must be contiguous");
}

// The M rows of a contiguous float32 x [M, K], each quantized by
// quantize(x_row, K, qx, step, offset, sum) into buffers this object owns.
class QuantizedRows {
 public:
  template <class Quantize>
  QuantizedRows(const float* x, int64_t M, int64_t K, Quantize&& quantize)
      : floats_(static_cast<size_t>(M * 3 * (K / kW4a8Group))), qx_(static_cast<size_t>(M * K)),
        rows_(static_cast<size_t>(M)) {
    const int64_t groups = K / kW4a8Group;
    for (int64_t m = 0; m < M; ++m) {
      float* f = floats_.data() + m * 3 * groups;
      rows_[m] = QuantizedRow{qx_.data() + m * K, f, f + groups, f + 2 * groups};
      quantize(x + m * K, K, qx_.data() + m * K, f, f + groups, f + 2 * groups);
    }
  }

  const QuantizedRow* data() const { return rows_.data(); }

 private:
  std::vector<float> floats_;
  std::vector<int8_t> qx_;
  std::vector<QuantizedRow> rows_;
};

}  // namespace structserve_cpu
