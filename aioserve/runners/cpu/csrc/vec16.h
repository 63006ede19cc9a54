// Sixteen-float vectors (loaded from floats or bfloat16) and the lane arithmetic of the
// compiled CPU kernels (GCC/Clang vector extensions: one AVX-512 register, two AVX
// ones, four NEON ones). Every sum here runs in a fixed order, so a result depends only
// on its own inputs, never on the machine's vector width.
#pragma once

#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace aioserve_cpu {

typedef float Vec16 __attribute__((vector_size(64)));
typedef int32_t Int16 __attribute__((vector_size(64)));
typedef uint16_t Half16 __attribute__((vector_size(32)));
typedef uint32_t UInt16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline Vec16 load16(const float* p) {
  Vec16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// Sixteen bfloat16 values (their bits as uint16_t) widened to floats: exact (a bfloat16
// is the top half of a float).
inline Vec16 load16(const uint16_t* p) {
#if defined(__AVX512F__)  // one widening instruction (GCC splits the generic one in two)
  const __m512i bits = _mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  return reinterpret_cast<Vec16>(_mm512_castsi512_ps(bits));
#else
  Half16 h;
  __builtin_memcpy(&h, p, sizeof(h));
  const UInt16 bits = __builtin_convertvector(h, UInt16) << 16;
  Vec16 v;
  __builtin_memcpy(&v, &bits, sizeof(v));
  return v;
#endif
}

inline void store16(float* p, Vec16 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// Sixteen floats rounded to bfloat16 bits as torch rounds them (c10::BFloat16: to nearest
// even, NaN to 0x7FC0), stored at p.
inline void store16(uint16_t* p, Vec16 v) {
  UInt16 bits;
  __builtin_memcpy(&bits, &v, sizeof(bits));
  UInt16 rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16;
  rounded = v != v ? UInt16{} + 0x7FC0 : rounded;
  const Half16 h = __builtin_convertvector(rounded, Half16);
  __builtin_memcpy(p, &h, sizeof(h));
}

// Eight floats, or eight bfloat16 widened exactly, copied to dst.
inline void widen8(float* dst, const float* src) { __builtin_memcpy(dst, src, 8 * sizeof(float)); }
inline void widen8(float* dst, const uint16_t* src) {
  typedef uint16_t Half8 __attribute__((vector_size(16)));
  typedef uint32_t UInt8 __attribute__((vector_size(32)));
  Half8 h;
  __builtin_memcpy(&h, src, sizeof(h));
  const UInt8 bits = __builtin_convertvector(h, UInt8) << 16;
  __builtin_memcpy(dst, &bits, sizeof(bits));
}

// One element as a float: itself, or a bfloat16's bits widened.
inline float as_float(float x) { return x; }
inline float as_float(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float v;
  __builtin_memcpy(&v, &bits, sizeof(v));
  return v;
}

// The sum of a vector's lanes in a fixed pairwise order.
inline float lane_sum(Vec16 v) {
  float half[8];
  for (int i = 0; i < 8; ++i) half[i] = v[i] + v[i + 8];
  return ((half[0] + half[4]) + (half[2] + half[6])) + ((half[1] + half[5]) + (half[3] + half[7]));
}

// Two vectors' lane pairs summed side by side: lanes 0-7 hold a's (0+1, 2+3, ...), lanes
// 8-15 b's.
inline Vec16 pair_sums(Vec16 a, Vec16 b) {
#if defined(__clang__)
  return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else  // GCC's two-vector shuffle (GCC 4.7 on; __builtin_shufflevector only from GCC 12)
  const Int16 even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  return __builtin_shuffle(a, b, even) + __builtin_shuffle(a, b, even + 1);
#endif
}

// Lane t of the result is the sum of v[t]'s sixteen lanes, for sixteen vectors at once: four
// rounds of pair_sums, a fixed tree for every lane (about three operations a sum, where
// sixteen lane_sums take about eight).
inline Vec16 lane_sums(const Vec16* v) {
  Vec16 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = pair_sums(v[2 * i], v[2 * i + 1]);
  for (int i = 0; i < 4; ++i) b[i] = pair_sums(a[2 * i], a[2 * i + 1]);
  for (int i = 0; i < 2; ++i) c[i] = pair_sums(b[2 * i], b[2 * i + 1]);
  return pair_sums(c[0], c[1]);
}

// e^x lane by lane: Cephes' expf (range reduction by ln 2 in two parts, degree-5
// polynomial; S. Moshier, Cephes Math Library), relative error about 1e-7. Arguments
// below -87.3 give about 1e-38 instead of a subnormal.
inline Vec16 exp16(Vec16 x) {
  const Vec16 lo = Vec16{} - 87.3f, hi = Vec16{} + 88.3f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  Vec16 fx = x * 1.44269504088896341f + 0.5f;
  Vec16 n = __builtin_convertvector(__builtin_convertvector(fx, Int16), Vec16);
  n = n > fx ? n - 1.f : n;  // floor
  x = x - n * 0.693359375f - n * -2.12194440e-4f;
  const Vec16 z = x * x;
  Vec16 y = 1.9875691500e-4f * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.f;
  const Int16 bits = (__builtin_convertvector(n, Int16) + 127) << 23;
  Vec16 scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

}  // namespace aioserve_cpu
