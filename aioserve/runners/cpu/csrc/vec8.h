// Eight-float vectors and their lanes, for the greedy-token kernel (GCC/Clang vector
// extensions: AVX on x86, NEON pairs on Arm).
#pragma once

#include <cstdint>

namespace aioserve_cpu {

typedef float Vec8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

inline Vec8 load8(const float* p) {
  Vec8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace aioserve_cpu
