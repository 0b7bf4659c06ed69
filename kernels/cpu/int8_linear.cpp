// structserve_cpu::int8_linear: y = (x @ W.T) * scale for a few rows of float32 x, W held as int8
// per output channel with a bf16 scale per row (engine/models/quantized_tensor.py's Int8Channels,
// the layout of torch's `_weight_int8pack_mm`, row-major, so the tied embedding shares the bytes).
// Specification: kernels/int8_linear.py (`int8_linear_ref`).
//
// Each weight row is widened 16 values at a time to float32 (vpmovsxbd + vcvtdq2ps) and multiplied
// into two float accumulators (even and odd vectors of 16 inputs) per x row, 4 weight rows at a
// time (2 with 3 or 4 x rows); a row's sum is then reduced and scaled. x stays float32 (torch's kernel rounds it to
// bf16). Every (x row, weight row) pair goes through the same operations whatever M is and however
// rows are split between threads, so a row's result never depends on the batch it came in.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kChunk = 64;    // weight rows per parallel task

inline __m512 widen(const int8_t* w, __mmask16 mask) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, w)));
}

inline float bf16_value(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Adds the products of inputs k .. k + 15 (`mask`: the ones that exist) into accumulator `half`.
template <int R, int MR>
inline void step16(const int8_t* w, const float* x, int64_t ldx, int64_t K, int64_t n0, int64_t rows, int64_t k,
                   __mmask16 mask, __m512 (&acc)[R][MR][2], int half) {
  __m512 xv[MR];
  for (int m = 0; m < MR; ++m) xv[m] = _mm512_maskz_loadu_ps(mask, x + m * ldx + k);
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    const __m512 wv = widen(w + (n0 + r) * K + k, mask);
    for (int m = 0; m < MR; ++m) acc[r][m][half] = _mm512_fmadd_ps(wv, xv[m], acc[r][m][half]);
  }
}

// y[m * ldy + n] for weight rows n0 .. n0 + rows - 1 (rows <= R) and MR rows of x.
template <int R, int MR>
inline void rows_dot(const int8_t* w, const uint16_t* scales, const float* x, int64_t ldx, int64_t K,
                     int64_t n0, int64_t rows, float* y, int64_t ldy) {
  __m512 acc[R][MR][2];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m][0] = acc[r][m][1] = _mm512_setzero_ps();
  const __mmask16 all = static_cast<__mmask16>(0xFFFF);
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    step16<R, MR>(w, x, ldx, K, n0, rows, k, all, acc, 0);
    step16<R, MR>(w, x, ldx, K, n0, rows, k + 16, all, acc, 1);
  }
  for (int half = 0; k < K; k += 16, ++half) {
    const __mmask16 mask = K - k >= 16 ? all : static_cast<__mmask16>((1u << (K - k)) - 1);
    step16<R, MR>(w, x, ldx, K, n0, rows, k, mask, acc, half);
  }
  for (int r = 0; r < R && r < rows; ++r) {
    const float scale = bf16_value(scales[n0 + r]);
    for (int m = 0; m < MR; ++m) {
      y[m * ldy + n0 + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][m][0], acc[r][m][1])) * scale;
    }
  }
}

// Weight rows [n_begin, n_end) for the MR x rows at `x`; R rows at a time (16-24 accumulators).
template <int MR>
void chunk_dot(const int8_t* w, const uint16_t* s, const float* x, int64_t K, int64_t n_begin, int64_t n_end,
               float* y, int64_t N) {
  constexpr int R = MR <= 2 ? 4 : 2;
  for (int64_t n = n_begin; n < n_end; n += R) {
    rows_dot<R, MR>(w, s, x, K, K, n, std::min<int64_t>(R, n_end - n), y, N);
  }
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "int8_linear: x must be float32 [M, K]");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar && weight.is_contiguous(),
              "int8_linear: weight must be contiguous int8 [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K, "int8_linear: weight is [N, K] with x's K = ", K, ", got ", weight.sizes());
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == N && scales.scalar_type() == at::kBFloat16 &&
                  scales.is_contiguous(),
              "int8_linear: scales must be contiguous bf16 [N]");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const int8_t* w = weight.data_ptr<int8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const float* xp = xc.data_ptr<float>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, (N + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n_begin = c * kChunk, n_end = std::min(N, (c + 1) * kChunk);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) chunk_dot<4>(w, s, xp + m * K, K, n_begin, n_end, out + m * N, N);
      switch (M - m) {
        case 3: chunk_dot<3>(w, s, xp + m * K, K, n_begin, n_end, out + m * N, N); break;
        case 2: chunk_dot<2>(w, s, xp + m * K, K, n_begin, n_end, out + m * N, N); break;
        case 1: chunk_dot<1>(w, s, xp + m * K, K, n_begin, n_end, out + m * N, N); break;
        default: break;
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor weight, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("int8_linear", &int8_linear); }
