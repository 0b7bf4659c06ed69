// structserve_cpu::paged_decode_attention: one query token per sequence against that sequence's
// keys, read in place from the paged cache through its block table (no gather of the contexts).
// Contract and torch reference: kernels/paged_attention.py (`paged_attention_ref` on an all-decode
// batch; `paged_decode_attention` picks this kernel). The checks, tasks and merge: paged_decode_tasks.h,
// which also sends the rows of a multi-token query laid out one row per token (the compiled step's
// prefill chunks and grammar-forced runs) to the prefill kernel's tiles (paged_prefill.h).
//
// Layout: q [num_seqs, num_heads, head_dim] float32; k_cache / v_cache [num_blocks, block_size,
// num_kv_heads, head_dim] float32, contiguous; block_tables [num_seqs, width] int32 (-1 padded);
// seq_lens [num_seqs] int32 >= 1. Query head h reads KV head h / (num_heads / num_kv_heads).
// One task per (sequence, KV head, chunk of 512 keys): the group's query heads share each key and
// value row as it is loaded. A task keeps its chunk's scores (at most 512 * group floats), then an
// exact softmax (max, exp, sum) and the weighted sum of the values; every sum in float32. A
// sequence of more than 512 keys is split so that one long context keeps every thread busy; its
// chunks' (max, sum, unnormalised values) are merged afterwards in chunk order (the log-sum-exp
// merge of split-key "flash decoding"). The split depends only on the sequence's own length, so a
// row's result never depends on the batch around it. Memory-bound: each K and V row of a
// sequence's context is read once per step. Measured on the project's 2-core AMD box, one sequence
// of 4,000 keys (SmolLM2's 3 KV heads, caches from memory): 407 against 522 us for one task per KV
// head; 1,000 keys: 40 against 55 us.

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "paged_decode_tasks.h"

namespace {

using structserve_cpu::AttendArgs;
using structserve_cpu::kMaxGroup;
using structserve_cpu::Partial;
using structserve_cpu::run_paged_decode;

// exp(x) for x <= 0 as 2^n * 2^f, n = round(x log2 e), |f| <= 1/2, 2^f by its Taylor polynomial of
// degree 7 (relative error below 1e-8 on that range), scaled with vscalefps.
inline __m512 exp_ps(__m512 x) {
  // exp(-104) is 0 in float32 (below the denormals); NaN in x is kept (max_ps returns its second
  // operand), as the torch reference's softmax keeps it
  x = _mm512_max_ps(_mm512_set1_ps(-104.f), x);
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.525273380405984e-05f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

template <int DC>
void attend_one(const float* q, const float* k_cache, const float* v_cache, const int32_t* table,
                int64_t t0, int64_t t1, int64_t block_size, int64_t row_stride, int64_t group, float scale,
                float* out, Partial* partial, std::vector<float>& scores) {
  constexpr int64_t D = DC * 16;
  const int64_t seq_len = t1 - t0;   // keys t0 .. t1 - 1; scores are indexed from t0
  const int64_t padded = (seq_len + 15) / 16 * 16;
  scores.resize(static_cast<size_t>(group * padded));
  __m512 qv[kMaxGroup][DC];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < DC; ++c) qv[g][c] = _mm512_mul_ps(_mm512_loadu_ps(q + g * D + c * 16), _mm512_set1_ps(scale));
  auto row = [&](const float* cache, int64_t t) {
    t += t0;
    return cache + (static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size) * row_stride;
  };
  // scores[g][t] = q_g . k_t * scale
  for (int64_t t = 0; t < seq_len; ++t) {
    const float* k = row(k_cache, t);
    if (t + 4 < seq_len) _mm_prefetch(reinterpret_cast<const char*>(row(k_cache, t + 4)), _MM_HINT_T0);
    __m512 kv[DC];
    for (int c = 0; c < DC; ++c) kv[c] = _mm512_loadu_ps(k + c * 16);
    for (int64_t g = 0; g < group; ++g) {
      __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
      for (int c = 1; c < DC; ++c) acc = _mm512_fmadd_ps(qv[g][c], kv[c], acc);
      scores[g * padded + t] = _mm512_reduce_add_ps(acc);
    }
  }
  // softmax numerators in place, and their sums
  float inv_sum[kMaxGroup], sums[kMaxGroup], maxes[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores.data() + g * padded;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < seq_len; t += 16) {
      const __mmask16 m = seq_len - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (seq_len - t)) - 1);
      mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, s + t));
    }
    maxes[g] = _mm512_reduce_max_ps(mx);
    const __m512 max = _mm512_set1_ps(maxes[g]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < seq_len; t += 16) {
      const __mmask16 m = seq_len - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (seq_len - t)) - 1);
      const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), max)));
      _mm512_mask_storeu_ps(s + t, m, e);
      sum = _mm512_add_ps(sum, e);
    }
    sums[g] = _mm512_reduce_add_ps(sum);
    inv_sum[g] = 1.f / sums[g];
  }
  // out_g = sum_t p[g][t] * v_t / sum_g
  __m512 acc[kMaxGroup][DC];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < DC; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < seq_len; ++t) {
    const float* v = row(v_cache, t);
    if (t + 4 < seq_len) _mm_prefetch(reinterpret_cast<const char*>(row(v_cache, t + 4)), _MM_HINT_T0);
    __m512 vv[DC];
    for (int c = 0; c < DC; ++c) vv[c] = _mm512_loadu_ps(v + c * 16);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * padded + t]);
      for (int c = 0; c < DC; ++c) acc[g][c] = _mm512_fmadd_ps(p, vv[c], acc[g][c]);
    }
  }
  if (partial != nullptr) {   // one chunk of several: its max, sum and unnormalised sum of values
    for (int64_t g = 0; g < group; ++g) {
      partial->max[g] = maxes[g];
      partial->sum[g] = sums[g];
      for (int c = 0; c < DC; ++c) _mm512_storeu_ps(partial->acc + g * D + c * 16, acc[g][c]);
    }
    return;
  }
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < DC; ++c)
      _mm512_storeu_ps(out + g * D + c * 16, _mm512_mul_ps(acc[g][c], _mm512_set1_ps(inv_sum[g])));
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  return run_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale,
                          [](const AttendArgs& a, std::vector<float>& scores) {
    structserve_cpu::with_head_chunks(a.head_dim, [&](auto chunks) {
      attend_one<decltype(chunks)::value>(a.q, a.k_cache, a.v_cache, a.table, a.t0, a.t1, a.block_size, a.row_stride,
                                          a.group, a.scale, a.out, a.partial, scores);
    });
  });
}

}  // namespace

STRUCTSERVE_REGISTER_PAGED_DECODE(paged_decode_attention)
