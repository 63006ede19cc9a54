// Linear products over weights stored in panels of 16 output columns (AVX2 + FMA).
//
//   torch.ops.aioserve_cpu.panel_linear(rows, panels, out, k_block)
//
// panels[p, k, j] = weight[16 p + j, k] (zero past the last output). Each thread takes
// a run of panels; a panel (K x 64 bytes, contiguous) is read from memory once per
// chunk of rows while the next one is prefetched, and tiles of up to 6 rows x 16
// columns keep their sums in 12 vector registers. Every output is a chain of fused
// multiply-adds over k from zero within each block of k_block inputs, the blocks' sums
// added in order; nothing else (not the tile, not the batch) enters its arithmetic.
// Built only where the compiler targets AVX2 and FMA.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace {

constexpr int64_t kPanel = 16;    // output columns per panel (two 8-float vectors)
constexpr int kRowsPerTile = 6;   // 6 rows x 2 vectors = 12 accumulators
constexpr int64_t kRowChunk = 96; // rows whose inputs stay in L2 while panels pass

// out[r, 0:cols] = rows[r] . panel for R rows: each output a chain of fused
// multiply-adds over k from 0 inside each block of k_block inputs, the blocks' sums
// added in order.
template <int R, bool Prefetch>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t K, int64_t k_block,
                 float* out, int64_t ldo, int64_t cols, const float* next) {
  __m256 c[R][2];
  for (int64_t k0 = 0; k0 < K; k0 += k_block) {
    const int64_t k1 = std::min(K, k0 + k_block);
    __m256 a[R][2];
    for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
      const __m256 b0 = _mm256_loadu_ps(w + k * kPanel);
      const __m256 b1 = _mm256_loadu_ps(w + k * kPanel + 8);
      if constexpr (Prefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(next + k * kPanel), _MM_HINT_T0);
      }
      for (int r = 0; r < R; ++r) {
        const __m256 v = _mm256_broadcast_ss(x + r * ldx + k);
        a[r][0] = _mm256_fmadd_ps(v, b0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(v, b1, a[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      c[r][0] = k0 == 0 ? a[r][0] : _mm256_add_ps(c[r][0], a[r][0]);
      c[r][1] = k0 == 0 ? a[r][1] : _mm256_add_ps(c[r][1], a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (cols == kPanel) {
      _mm256_storeu_ps(out + r * ldo, c[r][0]);
      _mm256_storeu_ps(out + r * ldo + 8, c[r][1]);
    } else {
      alignas(32) float tmp[kPanel];
      _mm256_store_ps(tmp, c[r][0]);
      _mm256_store_ps(tmp + 8, c[r][1]);
      std::memcpy(out + r * ldo, tmp, cols * sizeof(float));
    }
  }
}

template <bool Prefetch>
void tile_rows(int rows, const float* x, int64_t ldx, const float* w, int64_t K, int64_t kb,
               float* out, int64_t ldo, int64_t cols, const float* next) {
  switch (rows) {
    case 1: tile<1, Prefetch>(x, ldx, w, K, kb, out, ldo, cols, next); break;
    case 2: tile<2, Prefetch>(x, ldx, w, K, kb, out, ldo, cols, next); break;
    case 3: tile<3, Prefetch>(x, ldx, w, K, kb, out, ldo, cols, next); break;
    case 4: tile<4, Prefetch>(x, ldx, w, K, kb, out, ldo, cols, next); break;
    case 5: tile<5, Prefetch>(x, ldx, w, K, kb, out, ldo, cols, next); break;
    default: tile<6, Prefetch>(x, ldx, w, K, kb, out, ldo, cols, next); break;
  }
}

void panel_linear(const at::Tensor& rows, const at::Tensor& panels, const at::Tensor& out,
                  int64_t k_block) {
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous() && rows.scalar_type() == at::kFloat,
              "rows: contiguous [M, K] float32");
  TORCH_CHECK(panels.dim() == 3 && panels.is_contiguous() && panels.size(2) == kPanel &&
                  panels.size(1) == rows.size(1) && panels.scalar_type() == at::kFloat,
              "panels: contiguous [P, K, 16] float32 with K = rows.size(1)");
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) == rows.size(0) &&
                  out.size(1) <= panels.size(0) * kPanel &&
                  out.size(1) > (panels.size(0) - 1) * kPanel && out.scalar_type() == at::kFloat,
              "out: contiguous [M, N] float32 with N in the panels' last panel");
  TORCH_CHECK(k_block > 0, "k_block: positive");
  const int64_t M = rows.size(0), K = rows.size(1), N = out.size(1), P = panels.size(0);
  k_block = std::min(k_block, K);  // one block: the whole sum
  const float* x = rows.data_ptr<float>();
  const float* w = panels.data_ptr<float>();
  float* o = out.data_ptr<float>();
  if (K == 0) {  // empty sums
    out.zero_();
    return;
  }
  for (int64_t m0 = 0; m0 < M; m0 += kRowChunk) {
    const int64_t m1 = std::min(M, m0 + kRowChunk);
    at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const float* panel = w + p * K * kPanel;
        const int64_t cols = std::min(kPanel, N - p * kPanel);
        const int64_t tiles = (m1 - m0 + kRowsPerTile - 1) / kRowsPerTile;
        for (int64_t t = 0, m = m0; t < tiles; ++t) {
          // rows shared out evenly (32 = 6+6+5+5+5+5): a tile of 2 rows would leave
          // the FMA units waiting on their own latency
          const int r = static_cast<int>((m1 - m) / (tiles - t) +
                                         ((m1 - m) % (tiles - t) != 0));
          float* dst = o + m * N + p * kPanel;
          if (m == m0 && p + 1 < end) {
            tile_rows<true>(r, x + m * K, K, panel, K, k_block, dst, N, cols, panel + K * kPanel);
          } else {
            tile_rows<false>(r, x + m * K, K, panel, K, k_block, dst, N, cols, nullptr);
          }
          m += r;
        }
      }
    });
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("panel_linear(Tensor rows, Tensor panels, Tensor(a!) out, int k_block) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("panel_linear", &panel_linear); }
#endif
