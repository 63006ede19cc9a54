// The lean forward's rotary step on the CPU, with the step's K/V cache writes.
//
//   torch.ops.aioserve_cpu.rope_and_cache(qk, v, cos, signed_sin, slot_mapping, k_cache,
//                                         v_cache, q_out)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>

namespace {

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

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("rope_and_cache(Tensor qk, Tensor v, Tensor cos, Tensor signed_sin, "
        "Tensor slot_mapping, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor(c!) q_out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("rope_and_cache", &rope_and_cache); }
