// structserve_cpu::paged_decode_attention for CPUs with AVX2 and FMA but without AVX-512 (the
// library kernels/cpu_ops.py builds from this folder where the AVX-512 one cannot run). The same
// operator, contract and task split as kernels/cpu/paged_decode.cpp (paged_decode_tasks.h): one
// query token per sequence against its keys read in place through its block table, one task per
// (sequence, KV head, chunk of 512 keys), the group's query heads sharing each K and V row as it
// is loaded, an exact softmax per task in float32 and the split sequence's chunks merged in order;
// a row's result never depends on the batch around it; a multi-token query's rows go to the
// prefill kernel's tiles (paged_decode_tasks.h). Vectors of 8 floats: a head_dim chunk of 16 is
// two of them. Unlike the AVX-512 kernel, a task scores 8 keys per step and sums the values in
// tiles of 32 rows with its accumulators in registers (`attend_one`): 1.2-2.0x faster on 2 threads
// on the project's AMD box (1 sequence of 2,950 keys: 140-148 against 221-243 us; 8 of 350: 103-129
// against 210-223 us; 32 of 256: 322-356 against 405-570 us; alternating builds), equal on 1
// thread. Torch reference: kernels/paged_attention.py (`paged_attention_ref`).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../cpu/paged_decode_tasks.h"
#include "avx2_exp.h"

namespace {

using structserve_cpu::AttendArgs;
using structserve_cpu::kMaxGroup;
using structserve_cpu::run_paged_decode;
using structserve_cpu_avx2::exp_ps;

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// The accumulators below are named variables: an array of __m256 stays in memory under GCC (the
// kernel's float loads may alias it), which costs a load and a store per FMA.

// q . k_j for the 8 key rows k[0..7] (head_dim = NV * 8): one vector of the 8 dot products in key
// order, the sums folded by the hadd transposition.
template <int NV>
inline __m256 dot8(const float* q, const float* const* k) {
  const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3], *k4 = k[4], *k5 = k[5], *k6 = k[6], *k7 = k[7];
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  for (int c = 0; c < NV; ++c) {
    const __m256 x = _mm256_loadu_ps(q + c * 8);
    s0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + c * 8), s0);
    s1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + c * 8), s1);
    s2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + c * 8), s2);
    s3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + c * 8), s3);
    s4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k4 + c * 8), s4);
    s5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k5 + c * 8), s5);
    s6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k6 + c * 8), s6);
    s7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k7 + c * 8), s7);
  }
  // hadd pairs lanes within 128-bit halves: after two rounds, the low half of h0123 holds keys 0-3's
  // sums over their low 4 lanes and its high half those over the high 4 lanes; h4567 likewise
  const __m256 h0123 = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
  const __m256 h4567 = _mm256_hadd_ps(_mm256_hadd_ps(s4, s5), _mm256_hadd_ps(s6, s7));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

// acc[0 .. 8W) += sum_t p[t] * v_t[col .. col + 8W) over the n value rows v (W <= 8 vectors).
template <int W>
inline void weighted_rows(float* acc, const float* const* v, int64_t n, const float* p, int64_t col) {
  static_assert(W >= 1 && W <= 8);
  const __m256 zero = _mm256_setzero_ps();
  __m256 a0 = _mm256_loadu_ps(acc), a1 = zero, a2 = zero, a3 = zero, a4 = zero, a5 = zero, a6 = zero, a7 = zero;
  if constexpr (W > 1) a1 = _mm256_loadu_ps(acc + 8);
  if constexpr (W > 2) a2 = _mm256_loadu_ps(acc + 16);
  if constexpr (W > 3) a3 = _mm256_loadu_ps(acc + 24);
  if constexpr (W > 4) a4 = _mm256_loadu_ps(acc + 32);
  if constexpr (W > 5) a5 = _mm256_loadu_ps(acc + 40);
  if constexpr (W > 6) a6 = _mm256_loadu_ps(acc + 48);
  if constexpr (W > 7) a7 = _mm256_loadu_ps(acc + 56);
  for (int64_t t = 0; t < n; ++t) {
    const __m256 x = _mm256_broadcast_ss(p + t);
    const float* row = v[t] + col;
    a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row), a0);
    if constexpr (W > 1) a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 8), a1);
    if constexpr (W > 2) a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 16), a2);
    if constexpr (W > 3) a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 24), a3);
    if constexpr (W > 4) a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 32), a4);
    if constexpr (W > 5) a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 40), a5);
    if constexpr (W > 6) a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 48), a6);
    if constexpr (W > 7) a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 56), a7);
  }
  _mm256_storeu_ps(acc, a0);
  if constexpr (W > 1) _mm256_storeu_ps(acc + 8, a1);
  if constexpr (W > 2) _mm256_storeu_ps(acc + 16, a2);
  if constexpr (W > 3) _mm256_storeu_ps(acc + 24, a3);
  if constexpr (W > 4) _mm256_storeu_ps(acc + 32, a4);
  if constexpr (W > 5) _mm256_storeu_ps(acc + 40, a5);
  if constexpr (W > 6) _mm256_storeu_ps(acc + 48, a6);
  if constexpr (W > 7) _mm256_storeu_ps(acc + 56, a7);
}

constexpr int64_t kValueTile = 32;   // value rows per pass over the group's accumulators

// One task (see AttendArgs) for head_dim = NV * 8: scores 8 keys at a time (each key row read
// once per query head, from L1), an exact softmax per query head, then the values in tiles of
// kValueTile rows, each tile read once per query head (from L1) into that head's accumulators.
template <int NV>
void attend_one(const AttendArgs& a, std::vector<float>& scores) {
  constexpr int64_t D = NV * 8;
  const int64_t seq_len = a.t1 - a.t0, group = a.group;   // keys t0 .. t1 - 1; scores indexed from t0
  const int64_t padded = (seq_len + 7) / 8 * 8;
  scores.resize(static_cast<size_t>(group * padded));
  alignas(32) float qs[kMaxGroup * D];   // the scaled queries
  alignas(32) float acc[kMaxGroup * D];
  for (int64_t i = 0; i < group * D; ++i) {
    qs[i] = a.q[i] * a.scale;
    acc[i] = 0.f;
  }
  auto row = [&](const float* cache, int64_t t) {
    t += a.t0;
    return cache + (static_cast<int64_t>(a.table[t / a.block_size]) * a.block_size + t % a.block_size) * a.row_stride;
  };
  // scores[g][t] = q_g . k_t * scale; the padding past seq_len is -inf (exp gives 0 there)
  const float* keys[8];
  int64_t t = 0;
  for (; t + 8 <= seq_len; t += 8) {
    for (int j = 0; j < 8; ++j) keys[j] = row(a.k_cache, t + j);
    for (int64_t g = 0; g < group; ++g) _mm256_storeu_ps(scores.data() + g * padded + t, dot8<NV>(qs + g * D, keys));
  }
  for (; t < seq_len; ++t) {
    const float* k = row(a.k_cache, t);
    for (int64_t g = 0; g < group; ++g) {
      __m256 s = _mm256_mul_ps(_mm256_loadu_ps(qs + g * D), _mm256_loadu_ps(k));
      for (int c = 1; c < NV; ++c) {
        s = _mm256_fmadd_ps(_mm256_loadu_ps(qs + g * D + c * 8), _mm256_loadu_ps(k + c * 8), s);
      }
      scores[g * padded + t] = hsum(s);
    }
  }
  // softmax numerators in place, and their sums
  float inv_sum[kMaxGroup], sums[kMaxGroup], maxes[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores.data() + g * padded;
    for (int64_t t = seq_len; t < padded; ++t) s[t] = -INFINITY;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t t = 0; t < padded; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + t));
    maxes[g] = hmax(mx);
    const __m256 max = _mm256_set1_ps(maxes[g]);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < padded; t += 8) {
      const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + t), max));
      _mm256_storeu_ps(s + t, e);
      sum = _mm256_add_ps(sum, e);
    }
    sums[g] = hsum(sum);
    inv_sum[g] = 1.f / sums[g];
  }
  // acc_g = sum_t p[g][t] * v_t
  const float* values[kValueTile];
  for (int64_t t0 = 0; t0 < seq_len; t0 += kValueTile) {
    const int64_t n = std::min(kValueTile, seq_len - t0);
    for (int64_t j = 0; j < n; ++j) values[j] = row(a.v_cache, t0 + j);
    for (int64_t g = 0; g < group; ++g) {
      const float* p = scores.data() + g * padded + t0;
      for (int c = 0; c + 8 <= NV; c += 8) weighted_rows<8>(acc + g * D + c * 8, values, n, p, c * 8);
      if constexpr (NV % 8 != 0) weighted_rows<NV % 8>(acc + g * D + NV / 8 * 64, values, n, p, NV / 8 * 64);
    }
  }
  if (a.partial != nullptr) {   // one chunk of several: its max, sum and unnormalised sum of values
    for (int64_t g = 0; g < group; ++g) {
      a.partial->max[g] = maxes[g];
      a.partial->sum[g] = sums[g];
      std::copy(acc + g * D, acc + (g + 1) * D, a.partial->acc + g * D);
    }
    return;
  }
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < NV; ++c)
      _mm256_storeu_ps(a.out + g * D + c * 8,
                       _mm256_mul_ps(_mm256_loadu_ps(acc + g * D + c * 8), _mm256_set1_ps(inv_sum[g])));
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  return run_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale,
                          [](const AttendArgs& a, std::vector<float>& scores) {
    structserve_cpu::with_head_chunks(a.head_dim, [&](auto chunks) { attend_one<2 * decltype(chunks)::value>(a, scores); });
  });
}

}  // namespace

STRUCTSERVE_REGISTER_PAGED_DECODE(paged_decode_attention)
