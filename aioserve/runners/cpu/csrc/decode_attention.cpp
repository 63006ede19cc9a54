// Paged decode attention on the CPU: one query per sequence, the cache read in place.
//
//   torch.ops.aioserve_cpu.decode_attention(q, k_cache, v_cache, block_tables, seq_lens,
//                                           block_size, scale, out)
// Work is split over (sequence, KV head) pairs (at::parallel_for, torch's intra-op
// threads); each pair reads each of its K/V rows once for all the query heads that
// share it, keeps its scores in a buffer of its own and takes their softmax there.
// Every (sequence, head) result is summed in a fixed order that depends only on its own
// context, so a sequence's numbers are the same whatever its batch-mates.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vec8.h"

namespace {

using namespace aioserve_cpu;

void check(const at::Tensor& cache, const at::Tensor& block_tables, const at::Tensor& seq_lens) {
  TORCH_CHECK(cache.dim() == 3 &&
                  (cache.scalar_type() == at::kFloat || cache.scalar_type() == at::kBFloat16) &&
                  cache.stride(2) == 1,
              "cache: [rows, kv_heads, dim] float32 or bfloat16 with unit stride over dim");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kLong &&
                  block_tables.is_contiguous(), "block_tables: contiguous [b, W] int64");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kLong &&
                  seq_lens.size(0) == block_tables.size(0), "seq_lens: [b] int64");
}

// Softmax of `count` scores in place (their max subtracted, e^x, lanes summed in a
// fixed order); returns 1 / their sum.
inline float softmax_numerators(float* scores, int64_t count) {
  float top = scores[0];
  for (int64_t t = 1; t < count; ++t) top = scores[t] > top ? scores[t] : top;
  Vec8 sum = {};
  int64_t t = 0;
  for (; t + kLanes <= count; t += kLanes) {
    const Vec8 e = exp8(load8(scores + t) - top);
    store8(scores + t, e);
    sum += e;
  }
  if (t < count) {
    float rest[kLanes] = {};
    for (int64_t l = 0; t + l < count; ++l) rest[l] = scores[t + l] - top;
    const Vec8 e = exp8(load8(rest));
    for (int64_t l = 0; t + l < count; ++l) {
      scores[t + l] = e[l];
      sum[l] += e[l];
    }
  }
  return 1.f / lane_sum(sum);
}

template <typename T>
void attend(const float* q_ptr, const T* k_ptr, const T* v_ptr, float* o_ptr,
            const int64_t* lens, const int64_t* tables, int64_t batch, int64_t heads,
            int64_t kv_heads, int64_t dim, int64_t v_dim, int64_t width, int64_t block_size,
            int64_t longest, int64_t k_row, int64_t k_head, int64_t v_row, int64_t v_head,
            float alpha);

// out[b, h] = softmax_t(scale * q[b, h] . K[slot(b, t), h / group]) @ V[slot(b, t), ...]
// over t < seq_lens[b], slot(b, t) = block_tables[b, t / block_size] * block_size +
// t % block_size.
void decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_tables, const at::Tensor& seq_lens,
                      int64_t block_size, double scale, const at::Tensor& out) {
  check(k_cache, block_tables, seq_lens);
  check(v_cache, block_tables, seq_lens);
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat,
              "q: contiguous [b, heads, dim] float32");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), group = heads / kv_heads, v_dim = v_cache.size(2);
  TORCH_CHECK(k_cache.size(2) == dim && v_cache.size(1) == kv_heads && heads % kv_heads == 0 &&
                  k_cache.size(0) == v_cache.size(0), "q, k_cache and v_cache disagree");
  TORCH_CHECK(seq_lens.size(0) == batch, "seq_lens: one length per query");
  TORCH_CHECK(out.dim() == 3 && out.is_contiguous() && out.scalar_type() == at::kFloat &&
                  out.size(0) == batch && out.size(1) == heads && out.size(2) == v_dim,
              "out: contiguous [b, heads, v_dim] float32");
  TORCH_CHECK(block_size > 0, "block_size must be positive");
  const int64_t width = block_tables.size(1), rows = k_cache.size(0);
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] > 0 && lens[b] <= width * block_size, "seq_lens: each in 1..W * block_size");
    longest = std::max(longest, lens[b]);
  }
  for (int64_t i = 0; i < batch * width; ++i) {
    TORCH_CHECK(tables[i] >= 0 && (tables[i] + 1) * block_size <= rows,
                "block_tables: a block outside the cache");
  }
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k_cache and v_cache: one dtype");
  const float* q_ptr = q.data_ptr<float>();
  float* o_ptr = out.data_ptr<float>();
  const int64_t k_row = k_cache.stride(0), k_head = k_cache.stride(1);
  const int64_t v_row = v_cache.stride(0), v_head = v_cache.stride(1);
  const float alpha = static_cast<float>(scale);
  if (k_cache.scalar_type() == at::kFloat) {
    attend(q_ptr, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), o_ptr, lens, tables,
           batch, heads, kv_heads, dim, v_dim, width, block_size, longest, k_row, k_head, v_row,
           v_head, alpha);
  } else {  // bfloat16 rows, widened to floats as they are read (exact)
    attend(q_ptr, reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()),
           reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()), o_ptr, lens,
           tables, batch, heads, kv_heads, dim, v_dim, width, block_size, longest, k_row, k_head,
           v_row, v_head, alpha);
  }
}

template <typename T>
void attend(const float* q_ptr, const T* k_ptr, const T* v_ptr, float* o_ptr,
            const int64_t* lens, const int64_t* tables, int64_t batch, int64_t heads,
            int64_t kv_heads, int64_t dim, int64_t v_dim, int64_t width, int64_t block_size,
            int64_t longest, int64_t k_row, int64_t k_head, int64_t v_row, int64_t v_head,
            float alpha) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(group * longest);
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / kv_heads, kvh = pair % kv_heads, len = lens[b];
      const float* qb = q_ptr + (b * heads + kvh * group) * dim;
      const int64_t* table = tables + b * width;
      float* scores = buffer.data();
      for (int64_t start = 0; start < len; start += block_size) {
        const T* k = k_ptr + table[start / block_size] * block_size * k_row + kvh * k_head;
        const int64_t stop = std::min(len, start + block_size);
        int64_t t = start;
        for (; t + 4 <= stop; t += 4, k += 4 * k_row) {
          for (int64_t g = 0; g < group; ++g) {
            float dots[4];
            dot4(qb + g * dim, k, k + k_row, k + 2 * k_row, k + 3 * k_row, dim, dots);
            for (int64_t i = 0; i < 4; ++i) scores[g * len + t + i] = alpha * dots[i];
          }
        }
        for (; t < stop; ++t, k += k_row) {
          for (int64_t g = 0; g < group; ++g) scores[g * len + t] = alpha * dot(qb + g * dim, k, dim);
        }
      }
      float inverse[64];
      float* inv = group <= 64 ? inverse : nullptr;
      std::vector<float> wide;
      if (inv == nullptr) {
        wide.resize(group);
        inv = wide.data();
      }
      for (int64_t g = 0; g < group; ++g) inv[g] = softmax_numerators(scores + g * len, len);
      float* ob = o_ptr + (b * heads + kvh * group) * v_dim;
      for (int64_t i = 0; i < group * v_dim; ++i) ob[i] = 0.f;
      for (int64_t start = 0; start < len; start += block_size) {
        const T* v = v_ptr + table[start / block_size] * block_size * v_row + kvh * v_head;
        const int64_t count = std::min(len, start + block_size) - start;
        for (int64_t g = 0; g < group; ++g) {
          weighted_rows(ob + g * v_dim, scores + g * len + start, v, v_row, count, v_dim);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t d = 0; d < v_dim; ++d) ob[g * v_dim + d] *= inv[g];
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY(aioserve_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, int block_size, float scale, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("decode_attention", &decode_attention); }
