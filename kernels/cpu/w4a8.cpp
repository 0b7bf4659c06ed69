// structserve_cpu::w4a8_linear: y = x @ W.T for a few rows of x, W held as 4-bit groups of 32 with
// a bf16 scale and zero per group (w = (q - 8) * scale + zero, q in 0..15: the tinygemm convention
// of engine/models/quantized_tensor.py), x quantized per group of 32 to int8 on the fly, the
// products summed with AVX512-VNNI (vpdpbusd: unsigned 4-bit weights x signed 8-bit activations).
// The scheme is llama.cpp's Q4_1 x Q8_1 dot product; the code is ours. Specification and layout:
// kernels/w4a8_linear.py (`w4a8_linear_ref`, `pack_w4a8`).
//
// Lane order: a pair of groups (64 inputs) sits in one 64-byte vector so that int32 lane l of
// vpdpbusd (bytes 4l..4l+3) holds group l % 2, elements 4 * (l / 2) .. + 3; one instruction then
// gives 8 partial sums of each group, scaled per lane by its group's scale.
// Packed weight, per output row (K / 2 bytes): each quad of groups (128 inputs) is 64 bytes whose
// low nibbles are the first pair in lane order and whose high nibbles are the second pair; where K
// is not a multiple of 128 the last pair is 32 bytes, byte j holding lane positions 2j (low) and
// 2j + 1 (high).
//
// Per group g of a row: sum_i w_i x_i ~= scale * step * sum_i q_i qx_i
//                                         + zero * sum_i x_i - scale * 8 * step * sum_i qx_i,
// with step = max |x| / 127 of the activation group and sum_i x_i its exact float sum; the first
// term runs in the vector loop, the other two per group after it.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kPair = 64;
constexpr int64_t kQuad = 128;

// One x row, quantized: per pair the int8 values in lane order and the lane-wise steps (step of
// group 2p in even lanes, of 2p + 1 in odd ones); per group the exact float sum and
// 8 * step * (sum of the int8 values).
struct QuantizedRow {
  const int8_t* qx;          // [K]
  const float* lane_step;    // [K / 64 * 16]
  const float* group_sum;    // [K / 32]
  const float* offset;       // [K / 32]
};

// Quantizes x[0..K) into the buffers of `row` (vectorised: 2 zmm per group).
void quantize_row(const float* x, int64_t K, int8_t* qx, float* lane_step, float* group_sum, float* offset) {
  const __m512i interleave = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  for (int64_t p = 0; p < K / kPair; ++p) {
    __m512i bytes[2];
    float steps[2];
    for (int b = 0; b < 2; ++b) {
      const float* xg = x + p * kPair + b * kGroup;
      const __m512 lo = _mm512_loadu_ps(xg), hi = _mm512_loadu_ps(xg + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      const float step = amax / 127.f;
      const __m512 inv = _mm512_set1_ps(step > 0.f ? 1.f / step : 0.f);
      // round to nearest even (the default rounding mode), as std::nearbyint and torch.round
      const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
      const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
      const __m256i packed = _mm256_set_m128i(_mm512_cvtsepi32_epi8(qhi), _mm512_cvtsepi32_epi8(qlo));
      bytes[b] = _mm512_castsi256_si512(packed);
      steps[b] = step;
      const int64_t g = 2 * p + b;
      group_sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
      offset[g] = 8.f * step * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
    }
    // group 0's 8 dwords to the even lanes, group 1's to the odd ones
    _mm512_storeu_si512(qx + p * kPair, _mm512_permutex2var_epi32(bytes[0], interleave, bytes[1]));
    _mm512_storeu_ps(lane_step + p * 16,
                     _mm512_mask_mov_ps(_mm512_set1_ps(steps[0]), 0xAAAA, _mm512_set1_ps(steps[1])));
  }
}

// Lane-alternating (scale of group 2p, of group 2p + 1) as float32, from two bf16 values at `s`:
// each even dword takes bytes 0-1 as its high half, each odd dword bytes 2-3.
inline __m512 pair_scales(const uint16_t* s, __m512i spread) {
  int32_t both;
  std::memcpy(&both, s, 4);
  return _mm512_castsi512_ps(_mm512_shuffle_epi8(_mm512_set1_epi32(both), spread));
}

inline __m512i pair_scale_spread() {
  // per 16-byte lane of vpshufb: dword 0 <- (zero, zero, byte 0, byte 1), dword 1 <- (zero, zero, 2, 3)
  const __m128i one = _mm_setr_epi8(-128, -128, 0, 1, -128, -128, 2, 3, -128, -128, 0, 1, -128, -128, 2, 3);
  return _mm512_broadcast_i32x4(one);
}

inline __m512i low_nibbles(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline __m512i high_nibbles(__m512i v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }

// The 32-byte layout of a last pair: 64 nibbles in lane order.
inline __m512i unpack_last_pair(const uint8_t* w) {
  const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  // ((w << 4) | w) & 0x0F0F: low byte = low nibble, high byte = high nibble
  return _mm512_ternarylogic_epi32(words, _mm512_slli_epi16(words, 4), _mm512_set1_epi16(0x0F0F), 0xA8);
}

inline __m512 bf16_to_float(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }

// Per-group terms of one weight row: sum_g zero[g] * group_sum[g] - scale[g] * offset[g].
inline float group_terms(const uint16_t* scales, const uint16_t* zeros, const QuantizedRow& x, int64_t groups) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g += 16) {
    const __mmask16 m = groups - g >= 16 ? static_cast<__mmask16>(0xFFFF)
                                         : static_cast<__mmask16>((1u << (groups - g)) - 1);
    const __m512 z = bf16_to_float(_mm256_maskz_loadu_epi16(m, zeros + g));
    const __m512 s = bf16_to_float(_mm256_maskz_loadu_epi16(m, scales + g));
    acc = _mm512_fmadd_ps(z, _mm512_maskz_loadu_ps(m, x.group_sum + g), acc);
    acc = _mm512_fnmadd_ps(s, _mm512_maskz_loadu_ps(m, x.offset + g), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// y[m * ldy + n] for weight rows n0..n0 + rows - 1 (rows <= R) and MR x rows; every weight vector
// is unpacked once for all MR rows of x.
template <int R, int MR>
inline void rows_dot(const uint8_t* packed, const uint16_t* scales, const uint16_t* zeros,
                     const QuantizedRow* x, int64_t K, int64_t n0, int64_t rows, float* y, int64_t ldy) {
  const int64_t groups = K / kGroup, quads = K / kQuad;
  const bool last_pair = K % kQuad != 0;
  const __m512i spread = pair_scale_spread();
  __m512 acc[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  auto pair_step = [&](int r, const __m512i w, int64_t pair) {
    const __m512 scale = pair_scales(scales + (n0 + r) * groups + 2 * pair, spread);
    for (int m = 0; m < MR; ++m) {
      const __m512i qx = _mm512_loadu_si512(x[m].qx + pair * kPair);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, qx);
      const __m512 step = _mm512_loadu_ps(x[m].lane_step + pair * 16);
      acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, step), acc[r][m]);
    }
  };
  for (int64_t q = 0; q < quads; ++q) {
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
      const __m512i v = _mm512_loadu_si512(packed + (n0 + r) * (K / 2) + q * kPair);
      pair_step(r, low_nibbles(v), 2 * q);
      pair_step(r, high_nibbles(v), 2 * q + 1);
    }
  }
  if (last_pair) {
    for (int r = 0; r < R && r < rows; ++r) {
      pair_step(r, unpack_last_pair(packed + (n0 + r) * (K / 2) + quads * kPair), 2 * quads);
    }
  }
  for (int r = 0; r < R && r < rows; ++r) {
    const int64_t n = n0 + r;
    for (int m = 0; m < MR; ++m) {
      y[m * ldy + n] = _mm512_reduce_add_ps(acc[r][m]) + group_terms(scales + n * groups, zeros + n * groups, x[m], groups);
    }
  }
}

// Weight rows [n_begin, n_end) for the MR x rows starting at `x`.
template <int R, int MR>
void rows_block(const uint8_t* w, const uint16_t* s, const uint16_t* z, const QuantizedRow* x, int64_t K,
                int64_t n_begin, int64_t n_end, float* y, int64_t ldy) {
  for (int64_t n = n_begin; n < n_end; n += R) {
    rows_dot<R, MR>(w, s, z, x, K, n, std::min<int64_t>(R, n_end - n), y, ldy);
  }
}

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& zeros) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w4a8_linear: x must be float32 [M, K]");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte, "w4a8_linear: packed must be uint8 [N, K / 2]");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0);
  TORCH_CHECK(K % kPair == 0, "w4a8_linear: K must be a multiple of 64, got ", K);
  TORCH_CHECK(packed.size(1) == K / 2, "w4a8_linear: packed is [N, K / 2]");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && zeros.scalar_type() == at::kBFloat16,
              "w4a8_linear: scales and zeros must be bf16");
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == N && scales.size(1) == K / kGroup &&
                  zeros.sizes() == scales.sizes(),
              "w4a8_linear: scales and zeros are [N, K / 32]");
  TORCH_CHECK(packed.is_contiguous() && scales.is_contiguous() && zeros.is_contiguous(),
              "w4a8_linear: weights must be contiguous");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const int64_t groups = K / kGroup;
  // per x row: K int8 values, then K / 4 lane steps, K / 32 group sums and K / 32 offsets (floats)
  const int64_t floats_per_row = K / 4 + 2 * groups;
  std::vector<float> floats(static_cast<size_t>(M * floats_per_row));
  std::vector<int8_t> qx(static_cast<size_t>(M * K));
  std::vector<QuantizedRow> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    float* f = floats.data() + m * floats_per_row;
    rows[m] = QuantizedRow{qx.data() + m * K, f, f + K / 4, f + K / 4 + groups};
    quantize_row(xc.data_ptr<float>() + m * K, K, qx.data() + m * K, f, f + K / 4, f + K / 4 + groups);
  }
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  const auto* z = reinterpret_cast<const uint16_t*>(zeros.data_ptr());
  float* out = y.data_ptr<float>();
  constexpr int64_t kChunk = 16;  // rows of W per task: reused from L1 across the x rows
  at::parallel_for(0, (N + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n_begin = c * kChunk, n_end = std::min(N, (c + 1) * kChunk);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) rows_block<2, 4>(w, s, z, rows.data() + m, K, n_begin, n_end, out + m * N, N);
      switch (M - m) {
        case 3: rows_block<2, 3>(w, s, z, rows.data() + m, K, n_begin, n_end, out + m * N, N); break;
        case 2: rows_block<4, 2>(w, s, z, rows.data() + m, K, n_begin, n_end, out + m * N, N); break;
        case 1: rows_block<4, 1>(w, s, z, rows.data() + m, K, n_begin, n_end, out + m * N, N); break;
        default: break;
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(structserve_cpu, m) {
  m.def("w4a8_linear(Tensor x, Tensor packed, Tensor scales, Tensor zeros) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("w4a8_linear", &w4a8_linear); }
