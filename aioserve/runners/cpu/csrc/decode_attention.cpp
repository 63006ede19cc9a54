// Paged decode attention on the CPU: one query per sequence, the cache read in place.
//
//   torch.ops.aioserve_cpu.decode_attention(q, k_cache, v_cache, block_tables, seq_lens,
//                                           block_size, scale, out)
// Work is split over (sequence, KV head) pairs (at::parallel_for, torch's intra-op
// threads). A pair reads its context sixteen tokens at a time: their K rows, then their
// V rows, widened to floats (bfloat16 exactly) into a zero-padded tile of its own, so that
// every query head of the group reads them from there. Scores come sixteen at once
// (vec16.h's lane_sums), the softmax in its own buffer. Every (sequence, head) result is
// summed in a fixed order that depends only on its own context, so a sequence's numbers
// are the same whatever its batch-mates.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vec16.h"

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

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Softmax of `count` scores in place (their max subtracted, e^x, lanes summed in a
// fixed order; `scores` holds padded(count) floats); returns 1 / their sum.
inline float softmax_numerators(float* scores, int64_t count) {
  Vec16 tops = load16(scores);
  for (int64_t t = 0; t < count; t += kLanes) {
    Vec16 x = load16(scores + t);
    for (int64_t l = count - t; l < kLanes; ++l) x[l] = scores[0];  // past the context
    tops = x > tops ? x : tops;
  }
  float top = tops[0];
  for (int64_t l = 1; l < kLanes; ++l) top = tops[l] > top ? tops[l] : top;
  Vec16 sum = {};
  for (int64_t t = 0; t < count; t += kLanes) {
    Vec16 e = exp16(load16(scores + t) - top);
    for (int64_t l = count - t; l < kLanes; ++l) e[l] = 0.f;  // past the context
    store16(scores + t, e);
    sum += e;
  }
  return 1.f / lane_sum(sum);
}

// Rows start..start + count of a context of `len` tokens, from their cache slots, widened
// into `tile` (sixteen rows of `stride` floats; lanes past `dim` stay zero, rows past
// `count` are zeroed); the next tile's rows are prefetched.
template <typename T>
inline void load_tile(float* tile, int64_t stride, const T* cache, int64_t row, int64_t head,
                      const int64_t* table, int64_t block_size, int64_t start, int64_t count,
                      int64_t len, int64_t dim) {
  const int64_t bytes = dim * static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = start + i, ahead = t + kLanes;  // the next tile's row, fetched early
    if (ahead < len) {
      const char* next = reinterpret_cast<const char*>(
          cache + (table[ahead / block_size] * block_size + ahead % block_size) * row + head);
      for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(next + line);
    }
    const T* src = cache + (table[t / block_size] * block_size + t % block_size) * row + head;
    float* dst = tile + i * stride;
    int64_t d = 0;
    for (; d + kLanes <= dim; d += kLanes) store16(dst + d, load16(src + d));
    if (d + kLanes / 2 <= dim) {  // half a vector (narrow heads) in one move
      widen8(dst + d, src + d);
      d += kLanes / 2;
    }
    for (; d < dim; ++d) dst[d] = as_float(src[d]);
  }
  std::fill(tile + count * stride, tile + kLanes * stride, 0.f);
}

// Sixteen scores: lane t is q . tile[t] (rows of `vecs` vectors; rows past the context
// are zeros), each row summed over its vectors in order, then over its lanes (lane_sums).
inline Vec16 scores16(const float* q, const float* tile, int64_t vecs) {
  Vec16 acc[kLanes] = {};
  for (int64_t c = 0; c < vecs; ++c) {
    const Vec16 x = load16(q + c * kLanes);
    for (int64_t t = 0; t < kLanes; ++t) acc[t] += x * load16(tile + t * vecs * kLanes + c * kLanes);
  }
  return lane_sums(acc);
}

// out[0:16 * V] += sum over t < count, in order, of p[t] * tile[t] (rows `stride` floats
// apart), V vectors of lanes side by side.
template <int V>
inline void weighted_rows(float* out, const float* p, const float* tile, int64_t stride,
                          int64_t count) {
  Vec16 acc[V];
  for (int c = 0; c < V; ++c) acc[c] = load16(out + c * kLanes);
  for (int64_t t = 0; t < count; ++t) {
    const float w = p[t];
    for (int c = 0; c < V; ++c) acc[c] += w * load16(tile + t * stride + c * kLanes);
  }
  for (int c = 0; c < V; ++c) store16(out + c * kLanes, acc[c]);
}

// A thread's buffers, kept between calls (no allocation per call): a pair's queries and
// outputs per head, its K and V tiles, its scores and their 1 / sums; padding lanes zeroed
// each call.
struct Scratch {
  std::vector<float> q, out, k_tile, v_tile, scores, inv;
  void reset(int64_t group, int64_t k_pad, int64_t v_pad, int64_t longest) {
    q.assign(group * k_pad, 0.f);
    inv.resize(group);
    out.resize(group * v_pad);
    k_tile.assign(kLanes * k_pad, 0.f);
    v_tile.assign(kLanes * v_pad, 0.f);
    scores.resize(group * padded(longest));
  }
};

template <typename Q, typename T>
void attend(const Q* q_ptr, const T* k_ptr, const T* v_ptr, Q* o_ptr, const int64_t* lens,
            const int64_t* tables, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
            int64_t v_dim, int64_t width, int64_t block_size, int64_t longest, int64_t k_row,
            int64_t k_head, int64_t v_row, int64_t v_head, float alpha);

// out[b, h] = softmax_t(scale * q[b, h] . K[slot(b, t), h / group]) @ V[slot(b, t), ...]
// over t < seq_lens[b], slot(b, t) = block_tables[b, t / block_size] * block_size +
// t % block_size.
void decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_tables, const at::Tensor& seq_lens,
                      int64_t block_size, double scale, const at::Tensor& out) {
  check(k_cache, block_tables, seq_lens);
  check(v_cache, block_tables, seq_lens);
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "q: contiguous [b, heads, dim] float32 or bfloat16");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), v_dim = v_cache.size(2);
  TORCH_CHECK(k_cache.size(2) == dim && v_cache.size(1) == kv_heads && heads % kv_heads == 0 &&
                  k_cache.size(0) == v_cache.size(0), "q, k_cache and v_cache disagree");
  TORCH_CHECK(seq_lens.size(0) == batch, "seq_lens: one length per query");
  TORCH_CHECK(out.dim() == 3 && out.is_contiguous() && out.scalar_type() == q.scalar_type() &&
                  out.size(0) == batch && out.size(1) == heads && out.size(2) == v_dim,
              "out: contiguous [b, heads, v_dim] in q's dtype");
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
  const int64_t k_row = k_cache.stride(0), k_head = k_cache.stride(1);
  const int64_t v_row = v_cache.stride(0), v_head = v_cache.stride(1);
  const float alpha = static_cast<float>(scale);
  // bfloat16 as its bits (uint16_t): widened exactly as read, rounded once when written
  auto run = [&](auto* q_ptr, auto* o_ptr) {
    if (k_cache.scalar_type() == at::kFloat) {
      attend(q_ptr, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), o_ptr, lens, tables,
             batch, heads, kv_heads, dim, v_dim, width, block_size, longest, k_row, k_head,
             v_row, v_head, alpha);
    } else {
      attend(q_ptr, reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()),
             reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()), o_ptr, lens,
             tables, batch, heads, kv_heads, dim, v_dim, width, block_size, longest, k_row,
             k_head, v_row, v_head, alpha);
    }
  };
  if (q.scalar_type() == at::kFloat) {
    run(q.data_ptr<float>(), out.data_ptr<float>());
  } else {
    run(reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>()),
        reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
  }
}

inline void write(float* dst, float x) { *dst = x; }
inline void write(uint16_t* dst, float x) { *dst = c10::BFloat16(x).x; }  // torch's rounding

template <typename Q, typename T>
void attend(const Q* q_ptr, const T* k_ptr, const T* v_ptr, Q* o_ptr, const int64_t* lens,
            const int64_t* tables, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
            int64_t v_dim, int64_t width, int64_t block_size, int64_t longest, int64_t k_row,
            int64_t k_head, int64_t v_row, int64_t v_head, float alpha) {
  const int64_t group = heads / kv_heads, k_pad = padded(dim), v_pad = padded(v_dim);
  const int64_t k_vecs = k_pad / kLanes, v_vecs = v_pad / kLanes;
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch s;
    s.reset(group, k_pad, v_pad, longest);
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / kv_heads, kvh = pair % kv_heads, len = lens[b];
      const int64_t* table = tables + b * width;
      const int64_t stride = padded(len);
      for (int64_t g = 0; g < group; ++g) {
        const Q* qh = q_ptr + (b * heads + kvh * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) s.q[g * k_pad + d] = as_float(qh[d]);
      }
      // scores, sixteen tokens at a time: dims summed in lanes, then the lanes (lane_sums)
      for (int64_t start = 0; start < len; start += kLanes) {
        const int64_t count = std::min(kLanes, len - start);
        load_tile(s.k_tile.data(), k_pad, k_ptr, k_row, kvh * k_head, table, block_size, start,
                  count, len, dim);
        for (int64_t g = 0; g < group; ++g) {
          store16(s.scores.data() + g * stride + start,
                  alpha * scores16(s.q.data() + g * k_pad, s.k_tile.data(), k_vecs));
        }
      }
      float* inv = s.inv.data();
      for (int64_t g = 0; g < group; ++g) {
        inv[g] = softmax_numerators(s.scores.data() + g * stride, len);
      }
      // out[g] = sum over t, in order, of p[g, t] * V[t], a vector of lanes at a time
      std::fill(s.out.begin(), s.out.end(), 0.f);
      for (int64_t start = 0; start < len; start += kLanes) {
        const int64_t count = std::min(kLanes, len - start);
        load_tile(s.v_tile.data(), v_pad, v_ptr, v_row, kvh * v_head, table, block_size, start,
                  count, len, v_dim);
        for (int64_t g = 0; g < group; ++g) {
          float* og = s.out.data() + g * v_pad;
          const float* p = s.scores.data() + g * stride + start;
          if (v_vecs == 4) {
            weighted_rows<4>(og, p, s.v_tile.data(), v_pad, count);
          } else if (v_vecs == 8) {
            weighted_rows<8>(og, p, s.v_tile.data(), v_pad, count);
          } else {
            for (int64_t c = 0; c < v_vecs; ++c) {
              weighted_rows<1>(og + c * kLanes, p, s.v_tile.data() + c * kLanes, v_pad, count);
            }
          }
        }
      }
      Q* ob = o_ptr + (b * heads + kvh * group) * v_dim;
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t d = 0; d < v_dim; ++d) write(ob + g * v_dim + d, s.out[g * v_pad + d] * inv[g]);
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
