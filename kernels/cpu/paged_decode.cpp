// structserve_cpu::paged_decode_attention: one query token per sequence against that sequence's
// keys, read in place from the paged cache through its block table (no gather of the contexts).
// Contract and torch reference: kernels/paged_attention.py (`paged_attention_ref` on an all-decode
// batch; `paged_decode_attention` picks this kernel).
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

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int kMaxGroup = 8;      // query heads per KV head
constexpr int kMaxChunks = 16;    // head_dim / 16

// exp(x) for x <= 0 as 2^n * 2^f, n = round(x log2 e), |f| <= 1/2, 2^f by its Taylor polynomial of
// degree 7 (relative error below 1e-8 on that range), scaled with vscalefps.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));   // exp(-104) is 0 in float32 (below the denormals)
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

constexpr int64_t kChunkKeys = 512;   // keys per task when a sequence is split between threads

// One chunk's softmax state for the group's query heads (acc: group x head_dim floats).
struct Partial {
  float max[kMaxGroup];
  float sum[kMaxGroup];
  float* acc;
};

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

// out_g = sum_c acc_cg * exp(max_cg - M) / sum_c sum_cg * exp(max_cg - M), M = max_c max_cg: the
// chunks of one (sequence, KV head) merged in chunk order.
void merge_chunks(const Partial* chunks, int64_t num_chunks, int64_t group, int64_t D, float* out) {
  std::vector<float> sum(static_cast<size_t>(D));
  for (int64_t g = 0; g < group; ++g) {
    float top = -INFINITY;
    for (int64_t c = 0; c < num_chunks; ++c) top = std::max(top, chunks[c].max[g]);
    float total = 0.f;
    std::fill(sum.begin(), sum.end(), 0.f);
    for (int64_t c = 0; c < num_chunks; ++c) {
      const float w = std::exp(chunks[c].max[g] - top);
      total += chunks[c].sum[g] * w;
      for (int64_t d = 0; d < D; ++d) sum[d] += chunks[c].acc[g * D + d] * w;
    }
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = sum[d] / total;
  }
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat, "paged_decode_attention: q must be float32 [S, H, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.scalar_type() == at::kFloat && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode_attention: caches must be contiguous float32 [blocks, block_size, kv_heads, D]");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt &&
                  seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt,
              "paged_decode_attention: block_tables [S, W] and seq_lens [S] must be int32");
  const int64_t S = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t block_size = k_cache.size(1), KVH = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && D % 16 == 0 && D / 16 <= kMaxChunks,
              "paged_decode_attention: head_dim must match the cache and be a multiple of 16 up to 256");
  TORCH_CHECK(H % KVH == 0 && H / KVH <= kMaxGroup, "paged_decode_attention: at most 8 query heads per KV head");
  TORCH_CHECK(block_tables.size(0) == S && seq_lens.size(0) == S, "paged_decode_attention: one table row and length per sequence");
  const at::Tensor qc = q.contiguous(), tables = block_tables.contiguous(), lens = seq_lens.contiguous();
  const int64_t width = tables.size(1), num_blocks = k_cache.size(0);
  const int32_t* len = lens.data_ptr<int32_t>();
  const int32_t* tab = tables.data_ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(len[s] >= 1 && len[s] <= width * block_size, "paged_decode_attention: seq_lens out of the table's range");
    for (int64_t b = 0; b < (len[s] + block_size - 1) / block_size; ++b) {
      TORCH_CHECK(tab[s * width + b] >= 0 && tab[s * width + b] < num_blocks,
                  "paged_decode_attention: a block the context needs is not in the cache");
    }
  }
  at::Tensor out = at::empty({S, H, D}, q.options());
  const int64_t group = H / KVH, row_stride = KVH * D;
  const float* qp = qc.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // Tasks: (sequence, KV head, chunk of kChunkKeys keys). A sequence's chunks depend only on its own
  // length, so its result does not depend on the batch; a one-chunk task writes its output, the
  // chunks of a longer sequence write partial softmax states that are merged afterwards.
  struct Task {
    int64_t s, h, t0, t1, partial;   // partial: index of its Partial, -1 for a one-chunk task
  };
  std::vector<Task> tasks;
  struct Merge {
    int64_t s, h, first, chunks;   // a split (sequence, KV head): its first Partial and their count
  };
  std::vector<Merge> merges;
  int64_t num_partials = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t chunks = (len[s] + kChunkKeys - 1) / kChunkKeys;
    for (int64_t h = 0; h < KVH; ++h) {
      if (chunks > 1) merges.push_back(Merge{s, h, num_partials, chunks});
      for (int64_t c = 0; c < chunks; ++c) {
        tasks.push_back(Task{s, h, c * kChunkKeys, std::min<int64_t>(len[s], (c + 1) * kChunkKeys),
                             chunks > 1 ? num_partials++ : -1});
      }
    }
  }
  std::vector<float> partial_acc(static_cast<size_t>(num_partials * group * D));
  std::vector<Partial> partials(static_cast<size_t>(num_partials));
  for (int64_t i = 0; i < num_partials; ++i) partials[i].acc = partial_acc.data() + i * group * D;
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const Task& task = tasks[i];
      const int64_t s = task.s, h = task.h;
      const float* qh = qp + (s * H + h * group) * D;
      float* oh = op + (s * H + h * group) * D;
      const int32_t* table = tab + s * width;
      Partial* partial = task.partial >= 0 ? &partials[task.partial] : nullptr;
      switch (D / 16) {
#define STRUCTSERVE_CASE(DC) \
  case DC: attend_one<DC>(qh, kp + h * D, vp + h * D, table, task.t0, task.t1, block_size, row_stride, group, \
                          fscale, oh, partial, scores); break;
        STRUCTSERVE_CASE(1) STRUCTSERVE_CASE(2) STRUCTSERVE_CASE(3) STRUCTSERVE_CASE(4)
        STRUCTSERVE_CASE(5) STRUCTSERVE_CASE(6) STRUCTSERVE_CASE(7) STRUCTSERVE_CASE(8)
        STRUCTSERVE_CASE(9) STRUCTSERVE_CASE(10) STRUCTSERVE_CASE(11) STRUCTSERVE_CASE(12)
        STRUCTSERVE_CASE(13) STRUCTSERVE_CASE(14) STRUCTSERVE_CASE(15) STRUCTSERVE_CASE(16)
#undef STRUCTSERVE_CASE
        default: break;
      }
    }
  });
  for (const Merge& m : merges) {
    merge_chunks(partials.data() + m.first, m.chunks, group, D, op + (m.s * H + m.h * group) * D);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
