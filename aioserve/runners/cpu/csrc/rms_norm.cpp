// A bfloat16 residual add and RMSNorm on the CPU, with torch's bits:
//
//   torch.ops.aioserve_cpu.add_rms_norm(x, delta, weight, eps, x_out, h_out)
// x_out = x + delta (or x, where delta is empty), and h_out = LlamaRMSNorm(x_out):
//   x32 = float(x_out); variance = (x32 * x32).mean(-1)
//   h_out = weight * (x32 * rsqrt(variance + eps)).to(bfloat16)
// Each step is rounded as torch's ops round it: sums, products, the square root and the
// division in float32 (torch's rsqrt is 1 / sqrt, each correctly rounded), results to
// bfloat16 to nearest even. The mean is torch's own: its CPU sum over a contiguous row
// (aten/src/ATen/native/cpu/SumKernel.cpp: vectors of kSumLanes floats summed by
// multi_row_sum's four-level cascade, four rows of vectors at a time, then their lanes in
// order) divided by the row's length. The caller checks the sum against torch's once
// (native_kernels.add_rms_norm_exact) and keeps torch's ops where it differs.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "vec16.h"

namespace {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

constexpr int64_t kSumLanes = 8;  // the lanes of torch's summing vectors
constexpr int64_t kIlp = 4;       // rows of vectors summed side by side
constexpr int64_t kLevels = 4;    // multi_row_sum's cascade

typedef float Lanes __attribute__((vector_size(kSumLanes * sizeof(float))));

// Ceil of log2(n), 0 for n <= 1 (c10::utils::CeilLog2).
inline int64_t ceil_log2(int64_t n) {
  int64_t p = 0;
  while ((int64_t{1} << p) < n) ++p;
  return p;
}

// Sum of the `count` squares in `sq`, in torch's order (see the file's text).
float torch_row_sum(const float* sq, int64_t count) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const int64_t vecs = count / kSumLanes, size = vecs / kIlp;
  auto vec = [&](int64_t i) {
    Lanes x;
    __builtin_memcpy(&x, sq + i * kSumLanes, sizeof(x));
    return x;
  };
  const int64_t power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  Lanes acc[kLevels][kIlp] = {};
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i) {
      for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += vec(i * kIlp + k);
    }
    for (int64_t j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < kIlp; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = Lanes{};
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size; ++i) {
    for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += vec(i * kIlp + k);
  }
  for (int64_t j = 1; j < kLevels; ++j) {
    for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += acc[j][k];
  }
  for (int64_t v = size * kIlp; v < vecs; ++v) acc[0][0] += vec(v);
  for (int64_t k = 1; k < kIlp; ++k) acc[0][0] += acc[0][k];
  float total = 0.f;
  for (int64_t e = vecs * kSumLanes; e < count; ++e) total += sq[e];
  for (int64_t l = 0; l < kSumLanes; ++l) total += acc[0][0][l];
  return total;
}

void add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                  double eps, const at::Tensor& x_out, const at::Tensor& h_out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  auto bf16_rows = [](const at::Tensor& t) {
    return t.dim() == 2 && t.is_contiguous() && t.scalar_type() == at::kBFloat16;
  };
  TORCH_CHECK(bf16_rows(x), "x: contiguous [T, hidden] bfloat16");
  const int64_t tokens = x.size(0), hidden = x.size(1);
  const bool add = delta.numel() > 0;
  TORCH_CHECK(!add || (bf16_rows(delta) && delta.sizes() == x.sizes()),
              "delta: contiguous [T, hidden] bfloat16, or empty");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == hidden &&
                  weight.scalar_type() == at::kBFloat16, "weight: contiguous [hidden] bfloat16");
  TORCH_CHECK(bf16_rows(x_out) && x_out.sizes() == x.sizes() && bf16_rows(h_out) &&
                  h_out.sizes() == x.sizes(), "x_out, h_out: contiguous [T, hidden] bfloat16");
  const c10::BFloat16* x_ptr = x.data_ptr<c10::BFloat16>();
  const c10::BFloat16* d_ptr = add ? delta.data_ptr<c10::BFloat16>() : nullptr;
  const c10::BFloat16* w_ptr = weight.data_ptr<c10::BFloat16>();
  c10::BFloat16* xo_ptr = x_out.data_ptr<c10::BFloat16>();
  c10::BFloat16* h_ptr = h_out.data_ptr<c10::BFloat16>();
  const float epsilon = static_cast<float>(eps);  // torch adds a Python float in float32
  const float length = static_cast<float>(hidden);
  using aioserve_cpu::load16;
  using aioserve_cpu::store16;
  using aioserve_cpu::Vec16;
  const auto* xb = reinterpret_cast<const uint16_t*>(x_ptr);
  const auto* db = reinterpret_cast<const uint16_t*>(d_ptr);
  const auto* wb = reinterpret_cast<const uint16_t*>(w_ptr);
  auto* xob = reinterpret_cast<uint16_t*>(xo_ptr);
  auto* hb = reinterpret_cast<uint16_t*>(h_ptr);
  const int64_t body = hidden / 16 * 16;
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row, sq;  // kept between calls: no allocation a step
    row.resize(hidden);
    sq.resize(hidden);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t at = t * hidden;
      int64_t e = 0;
      for (; e < body; e += 16) {  // sixteen lanes, each rounded as the scalar tail below
        if (add) {
          store16(xob + at + e, load16(xb + at + e) + load16(db + at + e));
        } else {
          __builtin_memcpy(xob + at + e, xb + at + e, 16 * sizeof(uint16_t));
        }
        const Vec16 s = load16(xob + at + e);
        store16(row.data() + e, s);
        store16(sq.data() + e, s * s);
      }
      for (; e < hidden; ++e) {
        const c10::BFloat16 sum = add ? c10::BFloat16(static_cast<float>(x_ptr[at + e]) +
                                                      static_cast<float>(d_ptr[at + e]))
                                      : x_ptr[at + e];
        xo_ptr[at + e] = sum;
        row[e] = static_cast<float>(sum);
        sq[e] = row[e] * row[e];
      }
      const float variance = torch_row_sum(sq.data(), hidden) / length;
      const float scale = 1.f / std::sqrt(variance + epsilon);
      e = 0;
      for (; e < body; e += 16) {
        uint16_t normed[16];
        store16(normed, load16(row.data() + e) * scale);
        store16(hb + at + e, load16(wb + e) * load16(normed));
      }
      for (; e < hidden; ++e) {
        const c10::BFloat16 normed(row[e] * scale);
        h_ptr[at + e] = c10::BFloat16(static_cast<float>(w_ptr[e]) * static_cast<float>(normed));
      }
    }
  });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps, Tensor(a!) x_out, "
        "Tensor(b!) h_out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("add_rms_norm", &add_rms_norm); }
