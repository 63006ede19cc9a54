// SiLU(gate) * up for a bfloat16 MLP on the CPU, with torch's bits:
//
//   torch.ops.aioserve_cpu.silu_and_mul(gate_up, table, out)
// gate_up [T, 2I] holds gate then up side by side; out [T, I] = (silu(gate) * up) in
// bfloat16, as LlamaMLP computes it with torch's ops: silu rounded to bfloat16, then the
// product in float32 rounded to bfloat16 (to nearest even). A bfloat16 has 65,536 values,
// so silu comes from `table` [65536] float32: torch's own silu of every bfloat16 value,
// widened (native_kernels.silu_and_mul builds it with F.silu once a process).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>

#include "vec16.h"

namespace {

using aioserve_cpu::load16;
using aioserve_cpu::store16;
using aioserve_cpu::Vec16;

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void silu_and_mul(const at::Tensor& gate_up, const at::Tensor& table, const at::Tensor& out) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() &&
                  gate_up.scalar_type() == at::kBFloat16 && gate_up.size(1) % 2 == 0,
              "gate_up: contiguous [T, 2 I] bfloat16");
  TORCH_CHECK(table.dim() == 1 && table.is_contiguous() && table.size(0) == 65536 &&
                  table.scalar_type() == at::kFloat, "table: contiguous [65536] float32");
  const int64_t tokens = gate_up.size(0), width = gate_up.size(1) / 2;
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == at::kBFloat16 &&
                  out.size(0) == tokens && out.size(1) == width,
              "out: contiguous [T, I] bfloat16");
  const auto* x = reinterpret_cast<const uint16_t*>(gate_up.data_ptr<at::BFloat16>());
  const float* silu = table.data_ptr<float>();
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* gate = x + t * 2 * width;
      const uint16_t* up = gate + width;
      uint16_t* dst = o + t * width;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= width; i += 16) {  // sixteen table reads at once, the same values
        const __m512i index = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gate + i)));
        const Vec16 s = reinterpret_cast<Vec16>(_mm512_i32gather_ps(index, silu, 4));
        store16(dst + i, s * load16(up + i));
      }
#endif
      for (; i < width; ++i) {
        const float s = silu[gate[i]];
        const float u = static_cast<float>(c10::BFloat16(up[i], c10::BFloat16::from_bits()));
        dst[i] = c10::BFloat16(s * u).x;
      }
    }
  });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("silu_and_mul(Tensor gate_up, Tensor table, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("silu_and_mul", &silu_and_mul); }
