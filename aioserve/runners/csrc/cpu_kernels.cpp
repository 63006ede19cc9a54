// Paged decode attention on the CPU: one query per sequence, the cache read in place;
// and greedy token choice (arg max) over a step's logits.
//
// Ops registered as torch.ops.aioserve_cpu.*:
//   decode_attention(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out)
//   greedy_tokens(logits, out)
//   rope_and_cache(qk, v, cos, signed_sin, slot_mapping, k_cache, v_cache, q_out)
// Attention work is split over (sequence, KV head) pairs (at::parallel_for, torch's
// intra-op threads); each pair reads each of its K/V rows once for all the query heads
// that share it, keeps its scores in a buffer of its own and takes their softmax there.
// Every (sequence, head) result is summed in a fixed order that depends only on its own
// context, so a sequence's numbers are the same whatever its batch-mates.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

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

typedef int32_t Int8 __attribute__((vector_size(32)));

// e^x lane by lane: Cephes' expf (range reduction by ln 2 in two parts, degree-5
// polynomial; S. Moshier, Cephes Math Library), relative error about 1e-7. Arguments
// below -87.3 give about 1e-38 instead of a subnormal.
inline Vec8 exp8(Vec8 x) {
  const Vec8 lo = Vec8{} - 87.3f, hi = Vec8{} + 88.3f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  Vec8 fx = x * 1.44269504088896341f + 0.5f;
  Vec8 n = __builtin_convertvector(__builtin_convertvector(fx, Int8), Vec8);
  n = n > fx ? n - 1.f : n;  // floor
  x = x - n * 0.693359375f - n * -2.12194440e-4f;
  const Vec8 z = x * x;
  Vec8 y = 1.9875691500e-4f * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.f;
  const Int8 bits = (__builtin_convertvector(n, Int8) + 127) << 23;
  Vec8 scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
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
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = k_cache.data_ptr<float>();
  const float* v_ptr = v_cache.data_ptr<float>();
  float* o_ptr = out.data_ptr<float>();
  const int64_t k_row = k_cache.stride(0), k_head = k_cache.stride(1);
  const int64_t v_row = v_cache.stride(0), v_head = v_cache.stride(1);
  const float alpha = static_cast<float>(scale);
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(group * longest);
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / kv_heads, kvh = pair % kv_heads, len = lens[b];
      const float* qb = q_ptr + (b * heads + kvh * group) * dim;
      const int64_t* table = tables + b * width;
      float* scores = buffer.data();
      for (int64_t start = 0; start < len; start += block_size) {
        const float* k = k_ptr + table[start / block_size] * block_size * k_row + kvh * k_head;
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
        const float* v = v_ptr + table[start / block_size] * block_size * v_row + kvh * v_head;
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

// out[r] = the first index of row r's largest logit (of its first NaN, if any), as
// torch.argmax(logits, -1).
void greedy_tokens(const at::Tensor& logits, const at::Tensor& out) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat,
              "logits: contiguous [R, V] float32");
  TORCH_CHECK(out.dim() == 1 && out.size(0) == logits.size(0) &&
                  out.scalar_type() == at::kLong, "out: [R] int64");
  const int64_t num_rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(vocab > 0, "logits: an empty vocabulary");
  const float* x_ptr = logits.data_ptr<float>();
  int64_t* o_ptr = out.data_ptr<int64_t>();
  at::parallel_for(0, num_rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = x_ptr + r * vocab;
      Vec8 top = Vec8{} + x[0];
      Int8 nan = {};
      int64_t i = 0;
      for (; i + kLanes <= vocab; i += kLanes) {
        const Vec8 v = load8(x + i);
        top = v > top ? v : top;
        nan |= v != v;
      }
      float best = top[0];
      bool any_nan = false;
      for (int64_t l = 0; l < kLanes; ++l) {
        best = top[l] > best ? top[l] : best;
        any_nan = any_nan || nan[l] != 0;
      }
      for (; i < vocab; ++i) {
        best = x[i] > best ? x[i] : best;
        any_nan = any_nan || x[i] != x[i];
      }
      int64_t index = 0;
      if (any_nan) {
        while (x[index] == x[index]) ++index;
      } else {
        while (x[index] != best) ++index;
      }
      o_ptr[r] = index;
    }
  });
}

// The rotary embedding of a step's queries and keys (transformers' Llama rotation,
// `x * cos + rotate_half(x) * sin`, as the lean forward computes it:
// `x * cos + swap_halves(x) * signed_sin`), written out: queries to `q_out`
// [T, heads, dim], keys and values to their cache slots. Each element is one
// product, one product and one sum, each rounded, in that order: the same bits as
// torch's element-wise ops (contraction into fused multiply-adds is off here).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void rope_and_cache(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos,
                    const at::Tensor& signed_sin, const at::Tensor& slot_mapping,
                    const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& q_out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  TORCH_CHECK(qk.dim() == 3 && qk.scalar_type() == at::kFloat && qk.stride(2) == 1,
              "qk: [T, heads + kv_heads, dim] float32, unit stride over dim");
  const int64_t tokens = qk.size(0), dim = qk.size(2), half = dim / 2;
  const int64_t heads = q_out.size(1), kv_heads = k_cache.size(1);
  TORCH_CHECK(dim % 2 == 0 && qk.size(1) == heads + kv_heads, "qk: heads + kv_heads rows");
  TORCH_CHECK(v.dim() == 3 && v.scalar_type() == at::kFloat && v.stride(2) == 1 &&
                  v.size(0) == tokens && v.size(1) == kv_heads, "v: [T, kv_heads, v_dim]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.numel() == tokens * dim &&
                  signed_sin.scalar_type() == at::kFloat && signed_sin.is_contiguous() &&
                  signed_sin.numel() == tokens * dim, "cos, signed_sin: contiguous [T, 1, dim]");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong &&
                  slot_mapping.is_contiguous() && slot_mapping.size(0) == tokens,
              "slot_mapping: contiguous [T] int64");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.scalar_type() == at::kFloat && k_cache.stride(2) == 1 &&
                  k_cache.size(2) == dim && v_cache.dim() == 3 &&
                  v_cache.scalar_type() == at::kFloat && v_cache.stride(2) == 1 &&
                  v_cache.size(1) == kv_heads && v_cache.size(2) == v.size(2) &&
                  v_cache.size(0) == k_cache.size(0), "k_cache, v_cache: [rows, kv_heads, dim]");
  TORCH_CHECK(q_out.dim() == 3 && q_out.is_contiguous() && q_out.scalar_type() == at::kFloat &&
                  q_out.size(0) == tokens && q_out.size(2) == dim, "q_out: contiguous [T, heads, dim]");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t rows = k_cache.size(0), v_dim = v.size(2);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < rows, "slot_mapping: a slot outside the cache");
  }
  const float* qk_ptr = qk.data_ptr<float>();
  const float* v_ptr = v.data_ptr<float>();
  const float* cos_ptr = cos.data_ptr<float>();
  const float* sin_ptr = signed_sin.data_ptr<float>();
  float* k_ptr = k_cache.data_ptr<float>();
  float* vc_ptr = v_cache.data_ptr<float>();
  float* q_ptr = q_out.data_ptr<float>();
  const int64_t qk_row = qk.stride(0), qk_head = qk.stride(1);
  const int64_t v_row = v.stride(0), v_head = v.stride(1);
  const int64_t kc_row = k_cache.stride(0), kc_head = k_cache.stride(1);
  const int64_t vc_row = v_cache.stride(0), vc_head = v_cache.stride(1);
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos_ptr + t * dim;
      const float* s = sin_ptr + t * dim;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const float* x = qk_ptr + t * qk_row + h * qk_head;
        float* out = h < heads ? q_ptr + (t * heads + h) * dim
                               : k_ptr + slots[t] * kc_row + (h - heads) * kc_head;
        for (int64_t d = 0; d < half; ++d) {
          const float a = x[d] * c[d];
          const float b = x[d + half] * s[d];
          out[d] = a + b;
        }
        for (int64_t d = half; d < dim; ++d) {
          const float a = x[d] * c[d];
          const float b = x[d - half] * s[d];
          out[d] = a + b;
        }
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        const float* x = v_ptr + t * v_row + h * v_head;
        float* out = vc_ptr + slots[t] * vc_row + h * vc_head;
        for (int64_t d = 0; d < v_dim; ++d) out[d] = x[d];
      }
    }
  });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

}  // namespace

TORCH_LIBRARY(aioserve_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, int block_size, float scale, Tensor(a!) out) -> ()");
  m.def("greedy_tokens(Tensor logits, Tensor(a!) out) -> ()");
  m.def("rope_and_cache(Tensor qk, Tensor v, Tensor cos, Tensor signed_sin, Tensor slot_mapping, "
        "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor(c!) q_out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("greedy_tokens", &greedy_tokens);
  m.impl("rope_and_cache", &rope_and_cache);
}
