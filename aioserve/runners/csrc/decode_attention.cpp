// Paged decode attention on the CPU: one query per sequence, the cache read in place.
//
// Two ops, registered as torch.ops.aioserve_cpu.*:
//   decode_scores(q, k_cache, block_tables, seq_lens, block_size, scale, scores)
//   decode_values(weights, v_cache, block_tables, seq_lens, block_size, out)
// The softmax between them is torch's. Work is split over (sequence, KV head) pairs
// (at::parallel_for, torch's intra-op threads); each pair reads each of its K/V rows
// once for all the query heads that share it. Every (sequence, head) result is summed
// in a fixed order that depends only on its own context, so a sequence's numbers are
// the same whatever its batch-mates.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

// Eight floats as one vector (GCC/Clang vector extensions: AVX on x86, NEON pairs on Arm).
typedef float Vec8 __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

inline Vec8 load8(const float* p) {
  Vec8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(float* p, Vec8 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// Lane sums of a vector in a fixed pairwise order.
inline float lane_sum(Vec8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Dot product of two rows of `dim` floats: lanes of 8 (a ragged tail in the first
// lanes), then the lanes summed pairwise.
inline float dot(const float* a, const float* b, int64_t dim) {
  Vec8 acc = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) acc += load8(a + d) * load8(b + d);
  for (int64_t l = 0; d + l < dim; ++l) acc[l] += a[d + l] * b[d + l];
  return lane_sum(acc);
}

// Four dot products of `a` with rows b0..b3, each summed exactly as dot() sums it
// (four independent chains, so the additions overlap).
inline void dot4(const float* a, const float* b0, const float* b1, const float* b2,
                 const float* b3, int64_t dim, float* out) {
  Vec8 acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    const Vec8 x = load8(a + d);
    acc0 += x * load8(b0 + d);
    acc1 += x * load8(b1 + d);
    acc2 += x * load8(b2 + d);
    acc3 += x * load8(b3 + d);
  }
  for (int64_t l = 0; d + l < dim; ++l) {
    acc0[l] += a[d + l] * b0[d + l];
    acc1[l] += a[d + l] * b1[d + l];
    acc2[l] += a[d + l] * b2[d + l];
    acc3[l] += a[d + l] * b3[d + l];
  }
  out[0] = lane_sum(acc0);
  out[1] = lane_sum(acc1);
  out[2] = lane_sum(acc2);
  out[3] = lane_sum(acc3);
}

// o[0:dim] += sum over t < count of w[t] * v[t * stride + 0:dim], t in order (each
// element summed exactly as repeated single updates would).
inline void weighted_rows(float* o, const float* w, const float* v, int64_t stride,
                          int64_t count, int64_t dim) {
  int64_t d = 0;
  for (; d + 4 * kLanes <= dim; d += 4 * kLanes) {
    Vec8 a0 = load8(o + d), a1 = load8(o + d + 8), a2 = load8(o + d + 16), a3 = load8(o + d + 24);
    const float* row = v + d;
    for (int64_t t = 0; t < count; ++t, row += stride) {
      const float x = w[t];
      a0 += x * load8(row);
      a1 += x * load8(row + 8);
      a2 += x * load8(row + 16);
      a3 += x * load8(row + 24);
    }
    store8(o + d, a0); store8(o + d + 8, a1); store8(o + d + 16, a2); store8(o + d + 24, a3);
  }
  for (; d + kLanes <= dim; d += kLanes) {
    Vec8 a0 = load8(o + d);
    const float* row = v + d;
    for (int64_t t = 0; t < count; ++t, row += stride) a0 += w[t] * load8(row);
    store8(o + d, a0);
  }
  for (; d < dim; ++d) {
    float a0 = o[d];
    for (int64_t t = 0; t < count; ++t) a0 += w[t] * v[t * stride + d];
    o[d] = a0;
  }
}

void check(const at::Tensor& cache, const at::Tensor& block_tables, const at::Tensor& seq_lens) {
  TORCH_CHECK(cache.dim() == 3 && cache.scalar_type() == at::kFloat && cache.stride(2) == 1,
              "cache: [rows, kv_heads, dim] float32 with unit stride over dim");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kLong &&
                  block_tables.is_contiguous(), "block_tables: contiguous [b, W] int64");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kLong &&
                  seq_lens.size(0) == block_tables.size(0), "seq_lens: [b] int64");
}

// scores[b, h, t] = scale * q[b, h] . K[slot(b, t), h / group] for t < seq_lens[b],
// -inf for seq_lens[b] <= t < L.
void decode_scores(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& block_tables,
                   const at::Tensor& seq_lens, int64_t block_size, double scale,
                   const at::Tensor& scores) {
  check(k_cache, block_tables, seq_lens);
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat,
              "q: contiguous [b, heads, dim] float32");
  TORCH_CHECK(scores.dim() == 3 && scores.is_contiguous() && scores.size(0) == q.size(0) &&
                  scores.size(1) == q.size(1), "scores: contiguous [b, heads, L] float32");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), group = heads / kv_heads, length = scores.size(2);
  TORCH_CHECK(k_cache.size(2) == dim && heads % kv_heads == 0, "q and k_cache disagree");
  TORCH_CHECK(block_tables.size(1) * block_size >= length, "block_tables narrower than L");
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = k_cache.data_ptr<float>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  float* out = scores.data_ptr<float>();
  const int64_t row_stride = k_cache.stride(0), head_stride = k_cache.stride(1);
  const int64_t width = block_tables.size(1);
  const float alpha = static_cast<float>(scale);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / kv_heads, kvh = pair % kv_heads;
      const int64_t len = std::min(lens[b], length);
      const float* qb = q_ptr + (b * heads + kvh * group) * dim;
      float* sb = out + (b * heads + kvh * group) * length;
      for (int64_t start = 0; start < len; start += block_size) {
        const float* k = k_ptr + tables[b * width + start / block_size] * block_size * row_stride
                         + kvh * head_stride;
        const int64_t stop = std::min(len, start + block_size);
        int64_t t = start;
        for (; t + 4 <= stop; t += 4, k += 4 * row_stride) {
          for (int64_t g = 0; g < group; ++g) {
            float dots[4];
            dot4(qb + g * dim, k, k + row_stride, k + 2 * row_stride, k + 3 * row_stride, dim,
                 dots);
            for (int64_t i = 0; i < 4; ++i) sb[g * length + t + i] = alpha * dots[i];
          }
        }
        for (; t < stop; ++t, k += row_stride) {
          for (int64_t g = 0; g < group; ++g) {
            sb[g * length + t] = alpha * dot(qb + g * dim, k, dim);
          }
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t t = len; t < length; ++t) sb[g * length + t] = neg_inf;
      }
    }
  });
}

// out[b, h] = sum over t < seq_lens[b] of weights[b, h, t] * V[slot(b, t), h / group],
// summed in position order.
void decode_values(const at::Tensor& weights, const at::Tensor& v_cache,
                   const at::Tensor& block_tables, const at::Tensor& seq_lens,
                   int64_t block_size, const at::Tensor& out) {
  check(v_cache, block_tables, seq_lens);
  TORCH_CHECK(weights.dim() == 3 && weights.is_contiguous() && weights.scalar_type() == at::kFloat,
              "weights: contiguous [b, heads, L] float32");
  TORCH_CHECK(out.dim() == 3 && out.is_contiguous() && out.size(0) == weights.size(0) &&
                  out.size(1) == weights.size(1) && out.size(2) == v_cache.size(2),
              "out: contiguous [b, heads, v_dim] float32");
  const int64_t batch = weights.size(0), heads = weights.size(1), length = weights.size(2);
  const int64_t kv_heads = v_cache.size(1), group = heads / kv_heads, dim = v_cache.size(2);
  TORCH_CHECK(heads % kv_heads == 0, "weights and v_cache disagree");
  const float* w_ptr = weights.data_ptr<float>();
  const float* v_ptr = v_cache.data_ptr<float>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  float* o_ptr = out.data_ptr<float>();
  const int64_t row_stride = v_cache.stride(0), head_stride = v_cache.stride(1);
  const int64_t width = block_tables.size(1);
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / kv_heads, kvh = pair % kv_heads;
      const int64_t len = std::min(lens[b], length);
      const float* wb = w_ptr + (b * heads + kvh * group) * length;
      float* ob = o_ptr + (b * heads + kvh * group) * dim;
      for (int64_t i = 0; i < group * dim; ++i) ob[i] = 0.f;
      for (int64_t start = 0; start < len; start += block_size) {
        const float* v = v_ptr + tables[b * width + start / block_size] * block_size * row_stride
                         + kvh * head_stride;
        const int64_t stop = std::min(len, start + block_size);
        for (int64_t g = 0; g < group; ++g) {
          weighted_rows(ob + g * dim, wb + g * length + start, v, row_stride, stop - start, dim);
        }
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY(aioserve_cpu, m) {
  m.def("decode_scores(Tensor q, Tensor k_cache, Tensor block_tables, Tensor seq_lens, "
        "int block_size, float scale, Tensor(a!) scores) -> ()");
  m.def("decode_values(Tensor weights, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
        "int block_size, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) {
  m.impl("decode_scores", &decode_scores);
  m.impl("decode_values", &decode_values);
}
