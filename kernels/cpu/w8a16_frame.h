// The argument checks both w8a16_linear kernels share (kernels/cpu/w8a16.cpp with AVX512-VNNI,
// kernels/cpu_avx2/w8a16.cpp with AVX2). Plain C++: no instruction set of its own, so both
// libraries include it. Layout and scheme: kernels/w8a16_linear.py.

#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace structserve_cpu {

// Checks w8a16_linear's arguments (x float32 [M, K]; the layout of pack_w8a16 for N outputs, in
// blocks of 16 rows); raises with the layout's description otherwise.
inline void check_w8a16_args(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w8a16_linear: x must be float32 [M, K]");
  const int64_t K = x.size(1), blocks = (N + 15) / 16;
  TORCH_CHECK(K % 32 == 0, "w8a16_linear: K must be a multiple of 32, got ", K);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.size(0) == blocks &&
                  packed.size(1) == K * 16 && packed.is_contiguous(),
              "w8a16_linear: packed is contiguous uint8 [ceil(N / 16), K * 16]");
  TORCH_CHECK(scales.dim() == 2 && scales.scalar_type() == at::kBFloat16 && scales.size(0) == blocks &&
                  scales.size(1) == 16 && scales.is_contiguous(),
              "w8a16_linear: scales are contiguous bf16 [ceil(N / 16), 16]");
}

}  // namespace structserve_cpu
