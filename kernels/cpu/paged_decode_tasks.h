// The instruction-set-free part of structserve_cpu::paged_decode_attention, shared by the AVX-512
// kernel (kernels/cpu/paged_decode.cpp) and the AVX2 one (kernels/cpu_avx2/paged_decode.cpp):
// argument checks, the split of a step into tasks of (sequence, KV head, chunk of kChunkKeys keys),
// their run on torch's thread pool, and the merge of a split sequence's chunks. Rows that are
// consecutive tokens of one query (see `query_run_end`) go to the prefill kernel's tiles instead
// (paged_prefill.h). Contract and torch reference: kernels/paged_attention.py
// (`paged_decode_attention`, `paged_attention_ref`).

#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "paged_prefill.h"

namespace structserve_cpu {

constexpr int kMaxGroup = structserve_cpu_prefill::kMaxGroup;            // query heads per KV head
constexpr int kMaxChunks = structserve_cpu_prefill::kMaxHeadDim / 16;   // head_dim / 16
constexpr int64_t kChunkKeys = 512;   // keys per task when a sequence is split between threads
constexpr int64_t kMinQueryRun = 2;   // rows of one query that go to the prefill kernel together

// One chunk's softmax state for the group's query heads (acc: group x head_dim floats).
struct Partial {
  float max[kMaxGroup];
  float sum[kMaxGroup];
  float* acc;
};

// What a kernel computes for one task: the group's query heads (q: group x D floats, already
// unscaled) against keys t0 .. t1 - 1 of the sequence whose block table is `table`; writes out
// (group x D) or, when partial is set, the chunk's max, sum and unnormalised values.
struct AttendArgs {
  const float* q;
  const float* k_cache;   // the task's KV head's first value in the cache
  const float* v_cache;
  const int32_t* table;
  int64_t t0, t1, block_size, row_stride, group, head_dim;
  float scale;
  float* out;
  Partial* partial;
};

// out_g = sum_c acc_cg * exp(max_cg - M) / sum_c sum_cg * exp(max_cg - M), M = max_c max_cg: the
// chunks of one (sequence, KV head) merged in chunk order.
inline void merge_chunks(const Partial* chunks, int64_t num_chunks, int64_t group, int64_t D, float* out) {
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

// The end of the run of rows starting at `s` that are consecutive tokens of one query, as the
// compiled step lays out a multi-token query (a prefill chunk, a grammar-forced run): one row per
// token, each KV length one more than the row before, and the same whole table row. Two
// sequences can agree on the blocks a row reads (a shared prefix, the last prompt token of a full
// prefix-cache hit written again into a shared block), but never on a whole table row: each
// writes its next tokens to a block of its own (or has -1 where the other has one). So a run
// never joins two sequences, and a row's numbers depend only on its own sequence.
inline int64_t query_run_end(const int32_t* len, const int32_t* tab, int64_t width, int64_t s, int64_t num_rows) {
  int64_t e = s + 1;
  while (e < num_rows && len[e] == len[e - 1] + 1 &&
         std::equal(tab + (e - 1) * width, tab + e * width, tab + e * width)) {
    ++e;
  }
  return e;
}

// The whole operator around `attend(const AttendArgs&, std::vector<float>& scores)` (scores: the
// calling thread's scratch). Tasks: (sequence, KV head, chunk of kChunkKeys keys). A sequence's
// chunks depend only on its own length, so its result does not depend on the batch; a one-chunk
// task writes its output, the chunks of a longer sequence write partial softmax states that are
// merged afterwards. Raises (TORCH_CHECK) on shapes, dtypes or tables outside the contract.
template <class Attend>
at::Tensor run_paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale, Attend attend) {
  structserve_cpu_prefill::check_attention_shapes("paged_decode_attention", q, k_cache, v_cache);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt &&
                  seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt,
              "paged_decode_attention: block_tables [S, W] and seq_lens [S] must be int32");
  const int64_t S = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t block_size = k_cache.size(1), KVH = k_cache.size(2);
  TORCH_CHECK(block_tables.size(0) == S && seq_lens.size(0) == S, "paged_decode_attention: one table row and length per sequence");
  const at::Tensor qc = q.contiguous(), tables = block_tables.contiguous(), lens = seq_lens.contiguous();
  const int64_t width = tables.size(1), num_blocks = k_cache.size(0);
  const int32_t* len = lens.data_ptr<int32_t>();
  const int32_t* tab = tables.data_ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(len[s] >= 1 && len[s] <= width * block_size, "paged_decode_attention: seq_lens out of the table's range");
    structserve_cpu_prefill::check_context_blocks("paged_decode_attention", tab + s * width, len[s], block_size,
                                                  num_blocks);
  }
  at::Tensor out = at::empty({S, H, D}, q.options());
  const int64_t group = H / KVH, row_stride = KVH * D;
  const float* qp = qc.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  struct Task {
    int64_t s, h, t0, t1, partial;   // partial: index of its Partial, -1 for a one-chunk task
  };
  std::vector<Task> tasks;
  struct Merge {
    int64_t s, h, first, chunks;   // a split (sequence, KV head): its first Partial and their count
  };
  std::vector<Merge> merges;
  int64_t num_partials = 0;
  structserve_cpu_prefill::Plan query_plan;
  for (int64_t s = 0; s < S;) {
    const int64_t run_end = query_run_end(len, tab, width, s, S);
    if (run_end - s >= kMinQueryRun) {   // rows s .. run_end - 1: one query's tokens
      structserve_cpu_prefill::add_query_tasks(query_plan, tab + (run_end - 1) * width, s, len[s] - 1, run_end - s,
                                               KVH);
      s = run_end;
      continue;
    }
    const int64_t chunks = (len[s] + kChunkKeys - 1) / kChunkKeys;
    for (int64_t h = 0; h < KVH; ++h) {
      if (chunks > 1) merges.push_back(Merge{s, h, num_partials, chunks});
      for (int64_t c = 0; c < chunks; ++c) {
        tasks.push_back(Task{s, h, c * kChunkKeys, std::min<int64_t>(len[s], (c + 1) * kChunkKeys),
                             chunks > 1 ? num_partials++ : -1});
      }
    }
    ++s;
  }
  if (!query_plan.tasks.empty()) {
    structserve_cpu_prefill::run_tasks(
        structserve_cpu_prefill::Call{qp, kp, vp, op, H, group, D, block_size, row_stride, fscale}, query_plan);
  }
  std::vector<float> partial_acc(static_cast<size_t>(num_partials * group * D));
  std::vector<Partial> partials(static_cast<size_t>(num_partials));
  for (int64_t i = 0; i < num_partials; ++i) partials[i].acc = partial_acc.data() + i * group * D;
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const Task& task = tasks[i];
      const int64_t s = task.s, h = task.h;
      attend(AttendArgs{qp + (s * H + h * group) * D, kp + h * D, vp + h * D, tab + s * width, task.t0, task.t1,
                        block_size, row_stride, group, D, fscale, op + (s * H + h * group) * D,
                        task.partial >= 0 ? &partials[task.partial] : nullptr},
             scores);
    }
  });
  for (const Merge& m : merges) {
    merge_chunks(partials.data() + m.first, m.chunks, group, D, op + (m.s * H + m.h * group) * D);
  }
  return out;
}

// Calls f(std::integral_constant<int, DC>{}) for DC = head_dim / 16, 1 .. kMaxChunks (checked by
// run_paged_decode): the kernels instantiate their task for each head_dim.
template <class F>
void with_head_chunks(int64_t head_dim, F&& f) {
  switch (head_dim / 16) {
#define STRUCTSERVE_CASE(DC) \
  case DC: f(std::integral_constant<int, DC>{}); break;
    STRUCTSERVE_CASE(1) STRUCTSERVE_CASE(2) STRUCTSERVE_CASE(3) STRUCTSERVE_CASE(4)
    STRUCTSERVE_CASE(5) STRUCTSERVE_CASE(6) STRUCTSERVE_CASE(7) STRUCTSERVE_CASE(8)
    STRUCTSERVE_CASE(9) STRUCTSERVE_CASE(10) STRUCTSERVE_CASE(11) STRUCTSERVE_CASE(12)
    STRUCTSERVE_CASE(13) STRUCTSERVE_CASE(14) STRUCTSERVE_CASE(15) STRUCTSERVE_CASE(16)
#undef STRUCTSERVE_CASE
    default: break;
  }
}

}  // namespace structserve_cpu

// The operator's schema and its CPU implementation `fn` (one library per process defines it).
#define STRUCTSERVE_REGISTER_PAGED_DECODE(fn)                                                                 \
  TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {                                                                \
    m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "             \
          "Tensor seq_lens, float scale) -> Tensor");                                                          \
  }                                                                                                            \
  TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) { m.impl("paged_decode_attention", &fn); }
