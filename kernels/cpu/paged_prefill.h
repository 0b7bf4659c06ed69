// structserve_cpu::paged_prefill_attention: causal attention of a step's prefill tokens over their
// sequences' keys, read in place from the paged cache through the block tables (no gather of the
// contexts, no mask tensor). Written with AVX2 and FMA only, so both libraries of
// kernels/cpu_ops.py compile this one header (kernels/cpu/paged_prefill.cpp for the AVX-512 one,
// kernels/cpu_avx2/paged_prefill.cpp for the AVX2 one) and run the same code. Contract and torch
// reference: kernels/paged_attention.py (`paged_prefill_attention`, `paged_attention_ref`).
//
// Layout: q [num_tokens, num_heads, head_dim] float32, the sequences' query rows one after the
// other (sequence s owns rows cu_seqlens_q[s] .. cu_seqlens_q[s + 1] - 1, the last query_len of
// its seq_lens[s] tokens); k_cache / v_cache [num_blocks, block_size, num_kv_heads, head_dim]
// float32, contiguous; block_tables [num_seqs, width] int32. Query token j of a sequence with
// context c = seq_len - query_len sees keys 0 .. c + j. Query head h reads KV head h / group.
//
// Tasks: (sequence, KV head, tile of kTileTokens query tokens), taken by the threads from a shared
// counter, longest first; a tile over a long context is split into tasks of kSplitKeys keys whose
// softmax states are merged afterwards (`add_query_tasks`). A task's rows are its tokens' `group`
// query heads (row r = token * group + head), so each K and V value it reads serves every query
// head of the KV head. The algorithm
// is the online softmax of FlashAttention (Dao et al., 2022, arXiv:2205.14135, Algorithm 1) over
// tiles of kTileKeys keys, with every matrix kept "rows across lanes": the task's queries are
// packed once as Q^T [head_dim][rows], the scores of a key tile are S^T [keys][rows] and the
// output accumulates as O^T [head_dim][rows]. Both products are then one micro-kernel shape
// (4 broadcast scalars of a K or V row times 16 rows from two vector loads, 8 FMAs), read K and V
// rows where they lie in the cache, and the softmax's max, exponentials, sums and rescaling run
// on 8 rows per instruction. Scores are scaled by scale * log2(e) so the exponentials are 2^x.
// Every sum is float32. A tile's result depends only on its own sequence, so a row's numbers never
// depend on the batch around it.

#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../cpu_avx2/avx2_exp.h"

namespace structserve_cpu_prefill {

constexpr int64_t kTileTokens = 16;   // query tokens per task
constexpr int64_t kTileKeys = 64;     // keys per online-softmax step
constexpr int64_t kSplitKeys = 1024;  // keys per task when a tile's keys are split between tasks
constexpr int64_t kRowBlock = 16;     // rows per micro-kernel call (two vectors of 8)
constexpr int64_t kMaxGroup = 8;
constexpr int64_t kMaxHeadDim = 256;

// The checks both attention operators (this one and paged_decode_tasks.h's) make of q and the
// caches; `op` names the operator in the messages. Raises (TORCH_CHECK) unless q is float32
// [rows, H, D], the caches are contiguous float32 [blocks, block_size >= 1, KVH >= 1, D] alike,
// D is a multiple of 16 up to kMaxHeadDim and H a multiple of KVH, at most kMaxGroup times.
inline void check_attention_shapes(const char* op, const at::Tensor& q, const at::Tensor& k_cache,
                                   const at::Tensor& v_cache) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat, op, ": q must be float32 [rows, H, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.scalar_type() == at::kFloat && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() && v_cache.is_contiguous(),
              op, ": caches must be contiguous float32 [blocks, block_size, kv_heads, D]");
  const int64_t H = q.size(1), D = q.size(2), block_size = k_cache.size(1), KVH = k_cache.size(2);
  TORCH_CHECK(block_size > 0 && KVH > 0, op, ": the caches need blocks of at least one slot and a KV head");
  TORCH_CHECK(k_cache.size(3) == D && D % 16 == 0 && D <= kMaxHeadDim,
              op, ": head_dim must match the cache and be a multiple of 16 up to 256");
  TORCH_CHECK(H % KVH == 0 && H / KVH <= kMaxGroup, op, ": at most 8 query heads per KV head");
}

// Raises (TORCH_CHECK) unless every block the first `len` tokens of the table row `row` read is
// one of the cache's `num_blocks`.
inline void check_context_blocks(const char* op, const int32_t* row, int64_t len, int64_t block_size,
                                 int64_t num_blocks) {
  for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) {
    TORCH_CHECK(row[b] >= 0 && row[b] < num_blocks, op, ": a block the context needs is not in the cache");
  }
}

// What every task of one call shares.
struct Call {
  const float* q;        // [rows, heads, head_dim]
  const float* k_cache;  // [blocks, block_size, kv_heads, head_dim]
  const float* v_cache;
  float* out;            // shaped like q
  int64_t heads, group, head_dim, block_size, row_stride;   // row_stride: floats per cache slot
  float scale;            // softmax scale
};

// Query tokens t0 .. t1 - 1 of one sequence's query for one KV head, against keys k_begin ..
// k_end - 1. The query's token j is q and out row q_row + j and sees keys 0 .. context + j, read
// through `table`. A task of a split tile (partial >= 0) leaves its softmax state in the call's
// partial buffer number `partial` instead of writing out.
struct Task {
  const int32_t* table;
  int64_t q_row, context, kv_head, t0, t1, k_begin, k_end, partial;
};

// A tile whose keys were split: its tasks' partial states first .. first + chunks - 1.
struct Split {
  int64_t q_row, kv_head, t0, t1, first, chunks;
};

// The tasks of one call, and its split tiles.
struct Plan {
  std::vector<Task> tasks;
  std::vector<Split> splits;
  int64_t num_partials = 0;
};

// Appends the tasks of one sequence's query of query_len tokens (none when it is 0): tiles of
// kTileTokens tokens, each for every KV head. A tile whose keys seen by all its rows (context +
// t0 + 1) reach 2 x kSplitKeys is split into tasks of kSplitKeys keys, the last one running to
// the tile's end, so that a few tokens over a long context still keep every thread busy; every chunk
// starts at a key all the tile's rows see. The split depends only on the sequence.
inline void add_query_tasks(Plan& plan, const int32_t* table, int64_t q_row, int64_t context, int64_t query_len,
                            int64_t kv_heads) {
  for (int64_t t0 = 0; t0 < query_len; t0 += kTileTokens) {
    const int64_t t1 = std::min(query_len, t0 + kTileTokens), keys = context + t1;
    const int64_t chunks = std::max<int64_t>(1, (context + t0 + 1) / kSplitKeys);
    for (int64_t h = 0; h < kv_heads; ++h) {
      if (chunks == 1) {
        plan.tasks.push_back(Task{table, q_row, context, h, t0, t1, 0, keys, -1});
        continue;
      }
      plan.splits.push_back(Split{q_row, h, t0, t1, plan.num_partials, chunks});
      for (int64_t c = 0; c < chunks; ++c) {
        plan.tasks.push_back(Task{table, q_row, context, h, t0, t1, c * kSplitKeys,
                                  c + 1 == chunks ? keys : (c + 1) * kSplitKeys, plan.num_partials++});
      }
    }
  }
}

// Rows of a tile of t tokens, padded to whole micro-kernel blocks.
inline int64_t padded_rows(int64_t tokens, int64_t group) {
  return (tokens * group + kRowBlock - 1) / kRowBlock * kRowBlock;
}

// A partial state's floats: maxima and sums of the (padded) rows, then O^T.
inline int64_t partial_floats(int64_t group, int64_t head_dim) {
  const int64_t rows = padded_rows(kTileTokens, group);
  return rows * (2 + head_dim);
}

// A thread's buffers, reused across its tasks.
struct Scratch {
  std::vector<float> qt, st, ot, m, l, alpha;
  std::vector<int32_t> limit;   // per row: the keys it sees (compared as integers: exact past 2^24)
  std::vector<const float*> k_rows, v_rows;
};

// The micro-kernels keep their accumulators in named variables: in an array of __m256, GCC keeps
// them in memory too and stores every one of them on every iteration (the broadcasts' float loads
// may alias the array), which halved the kernel's speed.

// c[k][0..15] = sum_d a_k[d] * b[d * ldb + 0..15] for the key rows a_0 .. a_5 (S^T = K Q^T): 12
// accumulators, two vector loads and six broadcasts per 12 FMAs. Stored at c + k * ldc.
inline void keys6_times_packed(const float* const* a, const float* b, int64_t ldb, int64_t depth, float* c,
                               int64_t ldc) {
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t d = 0; d < depth; ++d) {
    const __m256 b0 = _mm256_loadu_ps(b + d * ldb), b1 = _mm256_loadu_ps(b + d * ldb + 8);
#define STRUCTSERVE_KEY(row, lo, hi)                  \
    {                                                 \
      const __m256 x = _mm256_broadcast_ss(row + d);  \
      lo = _mm256_fmadd_ps(x, b0, lo);                \
      hi = _mm256_fmadd_ps(x, b1, hi);                \
    }
    STRUCTSERVE_KEY(a0, c00, c01) STRUCTSERVE_KEY(a1, c10, c11) STRUCTSERVE_KEY(a2, c20, c21)
    STRUCTSERVE_KEY(a3, c30, c31) STRUCTSERVE_KEY(a4, c40, c41) STRUCTSERVE_KEY(a5, c50, c51)
  }
  const __m256 out[12] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
  for (int k = 0; k < 6; ++k) {
    _mm256_storeu_ps(c + k * ldc, out[2 * k]);
    _mm256_storeu_ps(c + k * ldc + 8, out[2 * k + 1]);
  }
}

// keys6_times_packed for one key row.
inline void key_times_packed(const float* a0, const float* b, int64_t ldb, int64_t depth, float* c) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00;
  for (int64_t d = 0; d < depth; ++d) {
    const __m256 b0 = _mm256_loadu_ps(b + d * ldb), b1 = _mm256_loadu_ps(b + d * ldb + 8);
    STRUCTSERVE_KEY(a0, c00, c01)
  }
#undef STRUCTSERVE_KEY
  _mm256_storeu_ps(c, c00);
  _mm256_storeu_ps(c + 8, c01);
}

// c[j][0..15] += sum_t v_t[d0 + j] * p[t * ldp + 0..15] for j < 4 (O^T += V^T P^T), over the
// n value rows v_0 .. v_{n-1}; c rows at c + j * ldc. Eight accumulators, two vector loads and
// four broadcasts per 8 FMAs.
inline void values_times_probs(const float* const* v, int64_t n, int64_t d0, const float* p, int64_t ldp, float* c,
                               int64_t ldc) {
  __m256 c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
  __m256 c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
  __m256 c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
  __m256 c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
  for (int64_t t = 0; t < n; ++t) {
    const __m256 b0 = _mm256_loadu_ps(p + t * ldp), b1 = _mm256_loadu_ps(p + t * ldp + 8);
    const float* row = v[t] + d0;
#define STRUCTSERVE_DIM(j, lo, hi)                    \
    {                                                 \
      const __m256 x = _mm256_broadcast_ss(row + j);  \
      lo = _mm256_fmadd_ps(x, b0, lo);                \
      hi = _mm256_fmadd_ps(x, b1, hi);                \
    }
    STRUCTSERVE_DIM(0, c00, c01) STRUCTSERVE_DIM(1, c10, c11) STRUCTSERVE_DIM(2, c20, c21) STRUCTSERVE_DIM(3, c30, c31)
#undef STRUCTSERVE_DIM
  }
  const __m256 out[8] = {c00, c01, c10, c11, c20, c21, c30, c31};
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(c + j * ldc, out[2 * j]);
    _mm256_storeu_ps(c + j * ldc + 8, out[2 * j + 1]);
  }
}

inline void run_task(const Call& c, const Task& task, Scratch& s, float* partials) {
  const int64_t D = c.head_dim, G = c.group, context = task.context;
  const float scale_log2 = c.scale * 1.44269504088896341f;   // scores in base 2
  const int64_t used_rows = (task.t1 - task.t0) * G;
  const int64_t R = padded_rows(task.t1 - task.t0, G);
  s.qt.assign(static_cast<size_t>(D * R), 0.f);
  s.ot.assign(static_cast<size_t>(D * R), 0.f);
  s.st.resize(static_cast<size_t>(kTileKeys * R));
  s.limit.resize(static_cast<size_t>(R));
  s.m.assign(static_cast<size_t>(R), -INFINITY);
  s.l.assign(static_cast<size_t>(R), 0.f);
  s.alpha.resize(static_cast<size_t>(R));
  s.k_rows.resize(kTileKeys);
  s.v_rows.resize(kTileKeys);
  // Q^T, pre-scaled; row r is token t0 + r / G, query head kv_head * G + r % G. Padding rows keep
  // zero queries and see every key of the task: finite, never stored.
  for (int64_t r = 0; r < R; ++r) {
    const int64_t token = r < used_rows ? task.t0 + r / G : task.t1 - 1;
    s.limit[r] = static_cast<int32_t>(context + token + 1);
    if (r >= used_rows) continue;
    const float* qrow = c.q + ((task.q_row + token) * c.heads + task.kv_head * G + r % G) * D;
    for (int64_t d = 0; d < D; ++d) s.qt[d * R + r] = qrow[d] * scale_log2;
  }
  const int32_t* table = task.table;
  const int64_t first_masked = context + task.t0 + 1;   // keys below it are seen by every row
  for (int64_t k0 = task.k_begin; k0 < task.k_end; k0 += kTileKeys) {
    const int64_t n = std::min(kTileKeys, task.k_end - k0);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t key = k0 + t;
      const int64_t slot = static_cast<int64_t>(table[key / c.block_size]) * c.block_size + key % c.block_size;
      s.k_rows[t] = c.k_cache + slot * c.row_stride + task.kv_head * D;
      s.v_rows[t] = c.v_cache + slot * c.row_stride + task.kv_head * D;
    }
    // S^T = K Q^T over the tile's n keys
    for (int64_t rb = 0; rb < R; rb += kRowBlock) {
      int64_t t = 0;
      for (; t + 6 <= n; t += 6) keys6_times_packed(&s.k_rows[t], s.qt.data() + rb, R, D, s.st.data() + t * R + rb, R);
      for (; t < n; ++t) key_times_packed(s.k_rows[t], s.qt.data() + rb, R, D, s.st.data() + t * R + rb);
    }
    if (k0 + n > first_masked) {   // causal mask: key k is hidden from rows whose limit is <= k
      for (int64_t t = 0; t < n; ++t) {
        const __m256i key = _mm256_set1_epi32(static_cast<int32_t>(k0 + t));
        float* row = s.st.data() + t * R;
        for (int64_t r = 0; r < R; r += 8) {
          const __m256i limit = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.limit.data() + r));
          const __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, key));
          _mm256_storeu_ps(row + r, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(row + r), seen));
        }
      }
    }
    // online softmax: new maxima, the old sums' and outputs' rescaling, P^T in place of S^T
    for (int64_t r = 0; r < R; r += 8) {
      const __m256 old_max = _mm256_loadu_ps(s.m.data() + r);
      __m256 mx = old_max;
      for (int64_t t = 0; t < n; ++t) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s.st.data() + t * R + r));
      const __m256 alpha = structserve_cpu_avx2::exp2_ps(_mm256_sub_ps(old_max, mx));   // 0 on the first tile
      __m256 sum = _mm256_mul_ps(_mm256_loadu_ps(s.l.data() + r), alpha);
      for (int64_t t = 0; t < n; ++t) {
        float* p = s.st.data() + t * R + r;
        const __m256 e = structserve_cpu_avx2::exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(p), mx));
        _mm256_storeu_ps(p, e);
        sum = _mm256_add_ps(sum, e);
      }
      _mm256_storeu_ps(s.m.data() + r, mx);
      _mm256_storeu_ps(s.l.data() + r, sum);
      _mm256_storeu_ps(s.alpha.data() + r, alpha);
    }
    if (k0 > task.k_begin) {
      for (int64_t d = 0; d < D; ++d) {
        float* o = s.ot.data() + d * R;
        for (int64_t r = 0; r < R; r += 8)
          _mm256_storeu_ps(o + r, _mm256_mul_ps(_mm256_loadu_ps(o + r), _mm256_loadu_ps(s.alpha.data() + r)));
      }
    }
    // O^T += V^T P^T
    for (int64_t rb = 0; rb < R; rb += kRowBlock)
      for (int64_t d = 0; d < D; d += 4)
        values_times_probs(s.v_rows.data(), n, d, s.st.data() + rb, R, s.ot.data() + d * R + rb, R);
  }
  if (task.partial >= 0) {   // m, l and O^T as they are, for merge_split
    float* state = partials + task.partial * partial_floats(G, D);
    std::copy(s.m.begin(), s.m.begin() + R, state);
    std::copy(s.l.begin(), s.l.begin() + R, state + R);
    std::copy(s.ot.begin(), s.ot.begin() + D * R, state + 2 * R);
    return;
  }
  for (int64_t r = 0; r < used_rows; ++r) {
    const int64_t token = task.t0 + r / G;
    float* orow = c.out + ((task.q_row + token) * c.heads + task.kv_head * G + r % G) * D;
    const float inv = 1.f / s.l[r];
    for (int64_t d = 0; d < D; ++d) orow[d] = s.ot[d * R + r] * inv;
  }
}

// Writes a split tile's rows from its chunks' states (in chunk order): out = sum_c O_c 2^(m_c - M)
// / sum_c l_c 2^(m_c - M), M = max_c m_c (the log-sum-exp merge of split-key "flash decoding";
// every row saw keys in every chunk, so each m_c is finite).
inline void merge_split(const Call& c, const Split& split, const float* partials) {
  const int64_t D = c.head_dim, G = c.group, R = padded_rows(split.t1 - split.t0, G);
  const int64_t stride = partial_floats(G, D);
  const float* first = partials + split.first * stride;
  std::vector<float> acc(static_cast<size_t>(D));
  for (int64_t r = 0; r < (split.t1 - split.t0) * G; ++r) {
    float top = -INFINITY;
    for (int64_t k = 0; k < split.chunks; ++k) top = std::max(top, first[k * stride + r]);
    float total = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < split.chunks; ++k) {
      const float* state = first + k * stride;
      const float w = std::exp2(state[r] - top);
      total += state[R + r] * w;
      for (int64_t d = 0; d < D; ++d) acc[d] += state[2 * R + d * R + r] * w;
    }
    const int64_t token = split.t0 + r / G;
    float* orow = c.out + ((split.q_row + token) * c.heads + split.kv_head * G + r % G) * D;
    for (int64_t d = 0; d < D; ++d) orow[d] = acc[d] / total;
  }
}

// Runs the plan's tasks on torch's threads, longest first, each thread taking the next from a
// shared counter, then merges its split tiles.
inline void run_tasks(const Call& call, Plan& plan) {
  std::vector<Task>& tasks = plan.tasks;
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) {
    return (a.k_end - a.k_begin) * (a.t1 - a.t0) > (b.k_end - b.k_begin) * (b.t1 - b.t0);
  });
  std::vector<float> partials(static_cast<size_t>(plan.num_partials * partial_floats(call.group, call.head_dim)));
  std::atomic<int64_t> next{0};
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), num_tasks);
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t i = next.fetch_add(1); i < num_tasks; i = next.fetch_add(1)) {
        run_task(call, tasks[i], scratch, partials.data());
      }
    }
  });
  for (const Split& split : plan.splits) merge_split(call, split, partials.data());
}

// The operator. Raises (TORCH_CHECK) on shapes, dtypes or tables outside the contract.
inline at::Tensor paged_prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                          const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                                          const at::Tensor& seq_lens, double scale) {
  check_attention_shapes("paged_prefill_attention", q, k_cache, v_cache);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt && seq_lens.dim() == 1 &&
                  seq_lens.scalar_type() == at::kInt && cu_seqlens_q.dim() == 1 &&
                  cu_seqlens_q.scalar_type() == at::kInt,
              "paged_prefill_attention: block_tables [S, W], cu_seqlens_q [S + 1] and seq_lens [S] must be int32");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), S = seq_lens.size(0);
  const int64_t block_size = k_cache.size(1), KVH = k_cache.size(2);
  TORCH_CHECK(block_tables.size(0) == S && cu_seqlens_q.size(0) == S + 1,
              "paged_prefill_attention: one table row, length and query start per sequence");
  const at::Tensor qc = q.contiguous(), tables = block_tables.contiguous(), lens = seq_lens.contiguous(),
                   cu = cu_seqlens_q.contiguous();
  const int32_t* len = lens.data_ptr<int32_t>();
  const int32_t* cq = cu.data_ptr<int32_t>();
  const int32_t* tab = tables.data_ptr<int32_t>();
  const int64_t width = tables.size(1), num_blocks = k_cache.size(0);
  TORCH_CHECK(cq[0] == 0 && cq[S] == T, "paged_prefill_attention: cu_seqlens_q must run from 0 to q's rows");
  Plan plan;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t query_len = cq[s + 1] - cq[s];
    TORCH_CHECK(query_len >= 0 && query_len <= len[s] && len[s] <= width * block_size,
                "paged_prefill_attention: query or sequence lengths out of range");
    check_context_blocks("paged_prefill_attention", tab + s * width, len[s], block_size, num_blocks);
    add_query_tasks(plan, tab + s * width, cq[s], len[s] - query_len, query_len, KVH);
  }
  at::Tensor out = at::empty({T, H, D}, q.options());
  run_tasks(Call{qc.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), out.data_ptr<float>(),
                 H, H / KVH, D, block_size, KVH * D, static_cast<float>(scale)},
            plan);
  return out;
}

}  // namespace structserve_cpu_prefill

// The operator's schema and CPU implementation (one library per process defines it).
#define STRUCTSERVE_REGISTER_PAGED_PREFILL()                                                                   \
  TORCH_LIBRARY_FRAGMENT(structserve_cpu, m) {                                                                \
    m.def("paged_prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "            \
          "Tensor cu_seqlens_q, Tensor seq_lens, float scale) -> Tensor");                                     \
  }                                                                                                            \
  TORCH_LIBRARY_IMPL(structserve_cpu, CPU, m) {                                                               \
    m.impl("paged_prefill_attention", &structserve_cpu_prefill::paged_prefill_attention);                      \
  }
