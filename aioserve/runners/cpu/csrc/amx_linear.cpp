// bfloat16 linear products on AMX tiles (Intel AMX-BF16), with a row's bits independent of
// how many rows share the call.
//
//   torch.ops.aioserve_cpu.amx_linear(rows, packed, out)
//
// packed[n, k, p, j, e] = weight[16 n + j, 32 k + 2 p + e]: for each 16 outputs and 32
// inputs, one 1 KB B tile in AMX's pair layout. Rows go in blocks of 32 (two A tiles; a
// short last block is copied into zeros), outputs in blocks of 32 (two B tiles), four
// float32 C tiles summing TDPBF16PS over k in order; each output rounds once to bfloat16
// (to nearest even, as torch). A row's sums meet only its own inputs and the weights, in
// an order fixed by K alone: no row count, block or thread count enters them. Threads take
// runs of output blocks over one chunk of rows at a time (the chunk's inputs stay in L2
// while the weights pass). Built only where the compiler targets AMX-TILE and AMX-BF16.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr int64_t kRows = 32;        // rows per block: two A tiles of 16
constexpr int64_t kCols = 16;        // outputs per B tile
constexpr int64_t kDepth = 32;       // inputs per tile (16 pairs)
constexpr int64_t kChunkBytes = 1 << 20;  // a chunk of rows' inputs, kept in L2

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux lends AMX's tile state to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM).
bool tiles_allowed() {
  static std::once_flag once;
  static bool allowed = false;
  std::call_once(once, [] {
    constexpr int kReqPerm = 0x1023, kXTileData = 18;
    allowed = syscall(SYS_arch_prctl, kReqPerm, kXTileData) == 0;
  });
  return allowed;
}

// Tiles 0-3: C (16 x 16 floats); 4, 5: A (16 rows x 32 bfloat16); 6, 7: B (16 pairs x 16).
void configure() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// out[0:32, 0:16 * B] for one block: rows x (lda in elements), tiles of B outputs at
// `weight` (K / 32 tiles each, 1 KB apart), sums to `sums` (32 x 32 floats).
template <int B>
inline void block(const uint16_t* x, int64_t lda, const uint16_t* weight, int64_t k_tiles,
                  float* sums) {
  _tile_zero(0);
  _tile_zero(1);
  if (B == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t stride = lda * static_cast<int64_t>(sizeof(uint16_t));
  const uint16_t* second = weight + k_tiles * kDepth * kCols;
  for (int64_t k = 0; k < k_tiles; ++k) {
    _tile_loadd(4, x + k * kDepth, stride);
    _tile_loadd(5, x + 16 * lda + k * kDepth, stride);
    _tile_loadd(6, weight + k * kDepth * kCols, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if (B == 2) {
      _tile_loadd(7, second + k * kDepth * kCols, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, sums, 128);
  _tile_stored(1, sums + 16 * 32, 128);
  if (B == 2) {
    _tile_stored(2, sums + 16, 128);
    _tile_stored(3, sums + 16 * 32 + 16, 128);
  }
}

void amx_linear(const at::Tensor& rows, const at::Tensor& packed, const at::Tensor& out) {
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous() && rows.scalar_type() == at::kBFloat16,
              "rows: contiguous [M, K] bfloat16");
  const int64_t M = rows.size(0), K = rows.size(1);
  TORCH_CHECK(K % kDepth == 0, "rows: K a multiple of 32");
  TORCH_CHECK(packed.dim() == 5 && packed.is_contiguous() &&
                  packed.scalar_type() == at::kBFloat16 && packed.size(1) == K / kDepth &&
                  packed.size(2) == 16 && packed.size(3) == kCols && packed.size(4) == 2,
              "packed: contiguous [N / 16, K / 32, 16, 16, 2] bfloat16");
  const int64_t n_tiles = packed.size(0), N = n_tiles * kCols, k_tiles = K / kDepth;
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == at::kBFloat16 &&
                  out.size(0) == M && out.size(1) == N, "out: contiguous [M, N] bfloat16");
  TORCH_CHECK(tiles_allowed(), "amx_linear: the kernel did not lend this process AMX tiles");
  if (M == 0) return;
  const auto* x = reinterpret_cast<const uint16_t*>(rows.data_ptr<at::BFloat16>());
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t tile_elems = k_tiles * kDepth * kCols;  // one output tile's weights
  const int64_t chunk = std::max<int64_t>(
      kRows, kChunkBytes / (K * static_cast<int64_t>(sizeof(uint16_t))) / kRows * kRows);
  const int64_t pairs = (n_tiles + 1) / 2;  // output blocks of 32 (the last may be 16)
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {
    const int64_t m1 = std::min(M, m0 + chunk);
    at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
      configure();
      alignas(64) float sums[kRows * 32];
      // the chunk's short last block, if any: its rows, then zeros (copied once a thread)
      const int64_t short_rows = (m1 - m0) % kRows, short_start = m1 - short_rows;
      thread_local std::vector<uint16_t> tail;  // kept between calls: no allocation a step
      if (short_rows > 0) {
        tail.assign(kRows * K, 0);
        std::memcpy(tail.data(), x + short_start * K, short_rows * K * 2);
      }
      for (int64_t pair = begin; pair < end; ++pair) {
        const int64_t n = 2 * pair;
        const bool both = n + 1 < n_tiles;
        for (int64_t r = m0; r < m1; r += kRows) {
          const int64_t count = std::min(kRows, m1 - r);
          const uint16_t* a = count < kRows ? tail.data() : x + r * K;
          if (both) {
            block<2>(a, K, w + n * tile_elems, k_tiles, sums);
          } else {
            block<1>(a, K, w + n * tile_elems, k_tiles, sums);
          }
          const int64_t cols = both ? 2 * kCols : kCols;
          for (int64_t i = 0; i < count; ++i) {
            uint16_t* dst = o + (r + i) * N + n * kCols;
            for (int64_t j = 0; j < cols; ++j) dst[j] = c10::BFloat16(sums[i * 32 + j]).x;
          }
        }
      }
      _tile_release();
    });
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aioserve_cpu, m) {
  m.def("amx_linear(Tensor rows, Tensor packed, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(aioserve_cpu, CPU, m) { m.impl("amx_linear", &amx_linear); }
#endif
