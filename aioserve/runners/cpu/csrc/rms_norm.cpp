// The end of a bfloat16 RMSNorm on the CPU, with transformers' bits:
//
//   torch.ops.aioserve_cpu.rms_norm_scale(x, variance, weight, eps, out)
// out = weight * (float(x) * rsqrt(variance + eps)).to(bfloat16), as LlamaRMSNorm computes
// it after its variance (the variance stays torch's: its sum order is torch's own). Each
// step is rounded as torch's element-wise ops round it: the sum, the square root and the
// division in float32 (torch's rsqrt is 1 / sqrt, each correctly rounded), the product to
// float32 then to bfloat16 (to nearest even), the weight's product to bfloat16.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

namespace {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void rms_norm_scale(const at::Tensor& x, const at::Tensor& variance, const at::Tensor& weight,
                    double eps, const at::Tensor& out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16,
              "x: contiguous [T, hidden] bfloat16");
  const int64_t tokens = x.size(0), hidden = x.size(1);
  TORCH_CHECK(variance.scalar_type() == at::kFloat && variance.is_contiguous() &&
                  variance.numel() == tokens, "variance: contiguous [T, 1] float32");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == hidden &&
                  weight.scalar_type() == at::kBFloat16, "weight: contiguous [hidden] bfloat16");
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() &&
                  out.scalar_type() == at::kBFloat16, "out: contiguous [T, hidden] bfloat16");
  const c10::BFloat16* x_ptr = x.data_ptr<c10::BFloat16>();
  const c10::BFloat16* w_ptr = weight.data_ptr<c10::BFloat16>();
  const float* var_ptr = variance.data_ptr<float>();
  c10::BFloat16* o_ptr = out.data_ptr<c10::BFloat16>();
  const float epsilon = static_cast<float>(eps);  // torch adds a Python float in float32
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float scale = 1.f / std::sqrt(var_ptr[t] + epsilon);
      const c10::BFloat16* row = x_ptr + t * hidden;
      c10::BFloat16* o = o_ptr + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) {
        const c10::BFloat16 normed(static_cast<float>(row[h]) * scale);
        o[h] = c10::BFloat16(static_cast<float>(w_ptr[h]) * static_cast<float>(normed));
      }
    }
  });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("rms_norm_scale(Tensor x, Tensor variance, Tensor weight, float eps, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("rms_norm_scale", &rms_norm_scale); }
