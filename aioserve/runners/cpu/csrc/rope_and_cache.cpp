// The lean forward's rotary step on the CPU, with the step's K/V cache writes.
//
//   torch.ops.aioserve_cpu.rope_and_cache(qk, v, cos, signed_sin, slot_mapping, k_cache,
//                                         v_cache, q_out)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>

namespace {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
// An element as a float, and a float rounded to the element's type as torch rounds it
// (bfloat16: to nearest even), so each step below gives torch's bits in either dtype.
inline float widen(float x) { return x; }
inline float widen(uint16_t x) {
  return static_cast<float>(c10::BFloat16(x, c10::BFloat16::from_bits()));
}
template <typename T> inline T narrow(float x);
template <> inline float narrow<float>(float x) { return x; }
template <> inline uint16_t narrow<uint16_t>(float x) { return c10::BFloat16(x).x; }

// The rotary embedding of a step's queries and keys (transformers' Llama rotation,
// `x * cos + rotate_half(x) * sin`, as the lean forward computes it:
// `x * cos + swap_halves(x) * signed_sin`), written out: queries to `q_out`
// [T, heads, dim], keys and values to their cache slots. Each element is one
// product, one product and one sum, each rounded to T, in that order: the same bits as
// torch's element-wise ops in float32 or bfloat16 (contraction into fused multiply-adds
// is off here).
// Strides: qk (token, head), v, k_cache, v_cache.
template <typename T>
void rotate(const T* qk_ptr, const T* v_ptr, const T* cos_ptr, const T* sin_ptr,
            const int64_t* slots, T* k_ptr, T* vc_ptr, T* q_ptr, int64_t tokens, int64_t heads,
            int64_t kv_heads, int64_t dim, int64_t v_dim, const int64_t* strides) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const int64_t qk_row = strides[0], qk_head = strides[1], v_row = strides[2], v_head = strides[3];
  const int64_t kc_row = strides[4], kc_head = strides[5], vc_row = strides[6], vc_head = strides[7];
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos_ptr + t * dim;
      const T* s = sin_ptr + t * dim;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const T* x = qk_ptr + t * qk_row + h * qk_head;
        T* out = h < heads ? q_ptr + (t * heads + h) * dim
                           : k_ptr + slots[t] * kc_row + (h - heads) * kc_head;
        for (int64_t d = 0; d < half; ++d) {  // two loops, each vectorised
          const float a = widen(narrow<T>(widen(x[d]) * widen(c[d])));
          const float b = widen(narrow<T>(widen(x[d + half]) * widen(s[d])));
          out[d] = narrow<T>(a + b);
        }
        for (int64_t d = half; d < dim; ++d) {
          const float a = widen(narrow<T>(widen(x[d]) * widen(c[d])));
          const float b = widen(narrow<T>(widen(x[d - half]) * widen(s[d])));
          out[d] = narrow<T>(a + b);
        }
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        const T* x = v_ptr + t * v_row + h * v_head;
        T* out = vc_ptr + slots[t] * vc_row + h * vc_head;
        for (int64_t d = 0; d < v_dim; ++d) out[d] = x[d];
      }
    }
  });
}

// Checks the tensors, then rotate() in their dtype.
void rope_and_cache(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos,
                    const at::Tensor& signed_sin, const at::Tensor& slot_mapping,
                    const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& q_out) {
  const at::ScalarType dtype = qk.scalar_type();
  TORCH_CHECK(qk.dim() == 3 && (dtype == at::kFloat || dtype == at::kBFloat16) &&
                  qk.stride(2) == 1,
              "qk: [T, heads + kv_heads, dim] float32 or bfloat16, unit stride over dim");
  const int64_t tokens = qk.size(0), dim = qk.size(2);
  const int64_t heads = q_out.size(1), kv_heads = k_cache.size(1);
  TORCH_CHECK(dim % 2 == 0 && qk.size(1) == heads + kv_heads, "qk: heads + kv_heads rows");
  TORCH_CHECK(v.dim() == 3 && v.scalar_type() == dtype && v.stride(2) == 1 &&
                  v.size(0) == tokens && v.size(1) == kv_heads, "v: [T, kv_heads, v_dim] in qk's dtype");
  TORCH_CHECK(cos.scalar_type() == dtype && cos.is_contiguous() && cos.numel() == tokens * dim &&
                  signed_sin.scalar_type() == dtype && signed_sin.is_contiguous() &&
                  signed_sin.numel() == tokens * dim, "cos, signed_sin: contiguous [T, 1, dim] in qk's dtype");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong &&
                  slot_mapping.is_contiguous() && slot_mapping.size(0) == tokens,
              "slot_mapping: contiguous [T] int64");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.scalar_type() == dtype && k_cache.stride(2) == 1 &&
                  k_cache.size(2) == dim && v_cache.dim() == 3 &&
                  v_cache.scalar_type() == dtype && v_cache.stride(2) == 1 &&
                  v_cache.size(1) == kv_heads && v_cache.size(2) == v.size(2) &&
                  v_cache.size(0) == k_cache.size(0), "k_cache, v_cache: [rows, kv_heads, dim]");
  TORCH_CHECK(q_out.dim() == 3 && q_out.is_contiguous() && q_out.scalar_type() == dtype &&
                  q_out.size(0) == tokens && q_out.size(2) == dim, "q_out: contiguous [T, heads, dim]");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t rows = k_cache.size(0), v_dim = v.size(2);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < rows, "slot_mapping: a slot outside the cache");
  }
  const int64_t strides[8] = {qk.stride(0), qk.stride(1), v.stride(0), v.stride(1),
                              k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
                              v_cache.stride(1)};
  if (dtype == at::kFloat) {
    rotate<float>(qk.data_ptr<float>(), v.data_ptr<float>(), cos.data_ptr<float>(),
                  signed_sin.data_ptr<float>(), slots, k_cache.data_ptr<float>(),
                  v_cache.data_ptr<float>(), q_out.data_ptr<float>(), tokens, heads, kv_heads,
                  dim, v_dim, strides);
  } else {  // bfloat16 as its bits
    auto bits = [](const at::Tensor& x) { return reinterpret_cast<uint16_t*>(x.data_ptr()); };
    rotate<uint16_t>(bits(qk), bits(v), bits(cos), bits(signed_sin), slots, bits(k_cache),
                     bits(v_cache), bits(q_out), tokens, heads, kv_heads, dim, v_dim, strides);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("rope_and_cache(Tensor qk, Tensor v, Tensor cos, Tensor signed_sin, "
        "Tensor slot_mapping, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor(c!) q_out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("rope_and_cache", &rope_and_cache); }
