// structserve_cpu::paged_decode_attention for CPUs with AVX2 and FMA but without AVX-512 (the
// library kernels/cpu_ops.py builds from this folder where the AVX-512 one cannot run). The same
// operator, contract and task split as kernels/cpu/paged_decode.cpp (paged_decode_tasks.h): one
// query token per sequence against its keys read in place through its block table, one task per
// (sequence, KV head, chunk of 512 keys), the group's query heads sharing each K and V row as it
// is loaded, an exact softmax per task in float32 and the split sequence's chunks merged in order;
// a row's result never depends on the batch around it; a multi-token query's rows go to the
// prefill kernel's tiles (paged_decode_tasks.h). Vectors of 8 floats: a head_dim chunk of 16 is
// two of them. Torch reference: kernels/paged_attention.py (`paged_attention_ref`).

#include <immintrin.h>

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

// One task (see AttendArgs) for head_dim = NV * 8.
template <int NV>
void attend_one(const AttendArgs& a, std::vector<float>& scores) {
  constexpr int64_t D = NV * 8;
  const int64_t seq_len = a.t1 - a.t0, group = a.group;   // keys t0 .. t1 - 1; scores indexed from t0
  const int64_t padded = (seq_len + 7) / 8 * 8;
  scores.resize(static_cast<size_t>(group * padded));
  __m256 qv[kMaxGroup][NV];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < NV; ++c) qv[g][c] = _mm256_mul_ps(_mm256_loadu_ps(a.q + g * D + c * 8), _mm256_set1_ps(a.scale));
  auto row = [&](const float* cache, int64_t t) {
    t += a.t0;
    return cache + (static_cast<int64_t>(a.table[t / a.block_size]) * a.block_size + t % a.block_size) * a.row_stride;
  };
  // scores[g][t] = q_g . k_t * scale; the padding past seq_len is -inf (exp gives 0 there)
  for (int64_t t = 0; t < seq_len; ++t) {
    const float* k = row(a.k_cache, t);
    if (t + 4 < seq_len) _mm_prefetch(reinterpret_cast<const char*>(row(a.k_cache, t + 4)), _MM_HINT_T0);
    __m256 kv[NV];
    for (int c = 0; c < NV; ++c) kv[c] = _mm256_loadu_ps(k + c * 8);
    for (int64_t g = 0; g < group; ++g) {
      __m256 acc = _mm256_mul_ps(qv[g][0], kv[0]);
      for (int c = 1; c < NV; ++c) acc = _mm256_fmadd_ps(qv[g][c], kv[c], acc);
      scores[g * padded + t] = hsum(acc);
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
  // out_g = sum_t p[g][t] * v_t / sum_g
  __m256 acc[kMaxGroup][NV];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < NV; ++c) acc[g][c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < seq_len; ++t) {
    const float* v = row(a.v_cache, t);
    if (t + 4 < seq_len) _mm_prefetch(reinterpret_cast<const char*>(row(a.v_cache, t + 4)), _MM_HINT_T0);
    __m256 vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = _mm256_loadu_ps(v + c * 8);
    for (int64_t g = 0; g < group; ++g) {
      const __m256 p = _mm256_set1_ps(scores[g * padded + t]);
      for (int c = 0; c < NV; ++c) acc[g][c] = _mm256_fmadd_ps(p, vv[c], acc[g][c]);
    }
  }
  if (a.partial != nullptr) {   // one chunk of several: its max, sum and unnormalised sum of values
    for (int64_t g = 0; g < group; ++g) {
      a.partial->max[g] = maxes[g];
      a.partial->sum[g] = sums[g];
      for (int c = 0; c < NV; ++c) _mm256_storeu_ps(a.partial->acc + g * D + c * 8, acc[g][c]);
    }
    return;
  }
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < NV; ++c)
      _mm256_storeu_ps(a.out + g * D + c * 8, _mm256_mul_ps(acc[g][c], _mm256_set1_ps(inv_sum[g])));
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
