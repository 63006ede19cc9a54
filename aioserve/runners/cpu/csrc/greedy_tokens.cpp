// Greedy token choice on the CPU: each row's arg max, read once in vector lanes.
//
//   torch.ops.aioserve_cpu.greedy_tokens(logits, out)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>

#include "vec16.h"

namespace {

using namespace aioserve_cpu;

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
      Vec16 top = Vec16{} + x[0];
      Int16 nan = {};
      int64_t i = 0;
      for (; i + kLanes <= vocab; i += kLanes) {
        const Vec16 v = load16(x + i);
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("greedy_tokens(Tensor logits, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("greedy_tokens", &greedy_tokens); }
