// structserve_cpu::w8a16_linear for CPUs with AVX2 and FMA but not AVX512-VNNI: the operator of
// kernels/cpu/w8a16.cpp over the same layout and the same scheme (kernels/w8a16_linear.py: int8
// weight rows with a bf16 scale each; x split per group of 32 into two int8 levels, the value and
// its rounding residual), its integer dot products made with vpmaddubsw and vpmaddwd. The code is
// ours; the sign trick below is the one llama.cpp's AVX2 int8 dot products use.
//
// The layout stores each weight as w + 128 (for vpdpbusd's unsigned operand); vpmaddubsw would
// overflow int16 on those (2 x 255 x 127). Flipping the top bit gives w back as int8; vpmaddubsw
// then multiplies |w| (0 .. 128, unsigned) by the activation with w's sign (vpsignb), so each pair
// of products is at most 2 x 128 x 127 = 32,512 and exact, and vpmaddwd with ones widens the pairs
// to int32 at once. The integer dot product equals the VNNI kernel's (which takes 128 x the sum of
// the activations back off its offset one), and the float steps after it are the same. A 64-byte
// vector of the layout (16 rows x 4 inputs) is taken as two 32-byte halves of 8 rows, as in
// kernels/cpu_avx2/w4a8.cpp. Every (x row, weight row) pair goes through the same operations
// whatever M is and however the work is split between threads, so a row's result never depends
// on the batch it came in.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "../cpu/w8a16_frame.h"
#include "avx2_rows.h"

namespace {

using namespace structserve_cpu_avx2;

constexpr int64_t kGroup = 32;    // inputs per activation group
constexpr int64_t kBlock = 16;    // weight rows per packed block
constexpr int64_t kHalf = 8;      // weight rows per 32-byte half: one int32 lane each
constexpr int64_t kVector = 64;   // bytes per packed vector: 16 rows x 4 inputs
constexpr int kLevels = 2;        // int8 levels per activation: the value and its rounding residual

// One x row as two int8 levels: per level its int8 values in input order and per group the step.
struct TwoLevelRow {
  const int8_t* q[kLevels];        // [K] each
  const float* step[kLevels];      // [K / 32] each
};

// Quantizes x[0..K) into the buffers of one TwoLevelRow: level 1 quantizes x, level 2 quantizes
// x - q1 * s1 (float32, rounded after the product and after the difference, as the reference).
void quantize_two_levels(const float* x, int64_t K, int8_t* q1, int8_t* q2, float* s1, float* s2) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + g * kGroup + 8 * i);
    const GroupQuant first = quantize_group(v, q1 + g * kGroup);
    const __m256 step = _mm256_set1_ps(first.step);
    __m256 residual[4];
    for (int i = 0; i < 4; ++i) residual[i] = _mm256_sub_ps(v[i], _mm256_mul_ps(_mm256_cvtepi32_ps(first.q[i]), step));
    s1[g] = first.step;
    s2[g] = quantize_group(residual, q2 + g * kGroup).step;
  }
}

// The 8 outputs of one half of a weight block for MR rows of x, times the half's scales, stored to
// y[m * ldy + 0 .. valid - 1]: `w` is the half's first 32 bytes (its vectors kVector apart),
// `scales` the half's 8 bf16. MR is at most 2: the two levels' int32 sums of more rows would not
// stay in AVX2's 16 registers.
template <int MR>
inline void half_dot(const uint8_t* w, const uint16_t* scales, const TwoLevelRow* x, int64_t K, float* y,
                     int64_t ldy, int64_t valid) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m256i dot[MR][kLevels];
    for (int m = 0; m < MR; ++m) dot[m][0] = dot[m][1] = _mm256_setzero_si256();
    for (int o = 0; o < kGroup / 4; ++o) {
      const __m256i signed_w = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (g * (kGroup / 4) + o) * kVector)), flip);
      const __m256i magnitude = _mm256_abs_epi8(signed_w);
      for (int m = 0; m < MR; ++m) {
        for (int l = 0; l < kLevels; ++l) {
          const __m256i a = _mm256_sign_epi8(broadcast4(x[m].q[l] + g * kGroup + o * 4), signed_w);
          dot[m][l] = _mm256_add_epi32(dot[m][l], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, a), ones));
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      for (int l = 0; l < kLevels; ++l) {
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[m][l]), _mm256_set1_ps(x[m].step[l][g]), acc[m]);
      }
    }
  }
  const __m256 scale = bf16_8(scales);
  for (int m = 0; m < MR; ++m) store_lanes(y + m * ldy, _mm256_mul_ps(acc[m], scale), valid);
}

at::Tensor w8a16_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t N) {
  structserve_cpu::check_w8a16_args(x, packed, scales, N);
  const int64_t M = x.size(0), K = x.size(1);
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const int64_t groups = K / kGroup;
  std::vector<int8_t> q(static_cast<size_t>(M * kLevels * K));
  std::vector<float> steps(static_cast<size_t>(M * kLevels * groups));
  std::vector<TwoLevelRow> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    int8_t* qm = q.data() + m * kLevels * K;
    float* sm = steps.data() + m * kLevels * groups;
    rows[m] = TwoLevelRow{{qm, qm + K}, {sm, sm + groups}};
    quantize_two_levels(xc.data_ptr<float>() + m * K, K, qm, qm + K, sm, sm + groups);
  }
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  float* out = y.data_ptr<float>();
  for_half_blocks(N, [&](int64_t b, int64_t h, int64_t n0, int64_t valid) {
    const uint8_t* wh = w + b * K * kBlock + h * (kVector / 2);
    const uint16_t* sh = s + b * kBlock + h * kHalf;
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) half_dot<2>(wh, sh, rows.data() + m, K, out + m * N + n0, N, valid);
    if (m < M) half_dot<1>(wh, sh, rows.data() + m, K, out + m * N + n0, N, valid);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {
  m.def("w8a16_linear(Tensor x, Tensor packed, Tensor scales, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("w8a16_linear", &w8a16_linear); }
