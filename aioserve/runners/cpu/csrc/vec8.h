// Eight-float vectors (loaded from floats or bfloat16) and the lane arithmetic the CPU kernels share (GCC/Clang vector
// extensions: AVX on x86, NEON pairs on Arm). Every sum here runs in a fixed order,
// so a result depends only on its own inputs.
#pragma once

#include <cstdint>

namespace aioserve_cpu {

typedef float Vec8 __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

inline Vec8 load8(const float* p) {
  Vec8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(float* p, Vec8 v) { __builtin_memcpy(p, &v, sizeof(v)); }

typedef uint16_t Half8 __attribute__((vector_size(16)));
typedef uint32_t UInt8 __attribute__((vector_size(32)));

// Eight bfloat16 values (their bits as uint16_t) widened to floats: exact (a bfloat16 is
// the top half of a float).
inline Vec8 load8(const uint16_t* p) {
  Half8 h;
  __builtin_memcpy(&h, p, sizeof(h));
  const UInt8 bits = __builtin_convertvector(h, UInt8) << 16;
  Vec8 v;
  __builtin_memcpy(&v, &bits, sizeof(v));
  return v;
}

// One element as a float: itself, or a bfloat16's bits widened.
inline float as_float(float x) { return x; }
inline float as_float(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float v;
  __builtin_memcpy(&v, &bits, sizeof(v));
  return v;
}

// Lane sums of a vector in a fixed pairwise order.
inline float lane_sum(Vec8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

typedef int32_t Int8 __attribute__((vector_size(32)));

// e^x lane by lane: Cephes' expf (range reduction by ln 2 in two parts, degree-5
// polynomial; S. Moshier, Cephes Math Library), relative error about 1e-7. Arguments
// below -87.3 give about 1e-38 instead of a subnormal.
inline Vec8 exp8(Vec8 x) {
  const Vec8 lo = Vec8{} - 87.3f, hi = Vec8{} + 88.3f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  Vec8 fx = x * 1.44269504088896341f + 0.5f;
  Vec8 n = __builtin_convertvector(__builtin_convertvector(fx, Int8), Vec8);
  n = n > fx ? n - 1.f : n;  // floor
  x = x - n * 0.693359375f - n * -2.12194440e-4f;
  const Vec8 z = x * x;
  Vec8 y = 1.9875691500e-4f * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.f;
  const Int8 bits = (__builtin_convertvector(n, Int8) + 127) << 23;
  Vec8 scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// Dot product of two rows of `dim` floats: lanes of 8 (a ragged tail in the first
// lanes), then the lanes summed pairwise.
template <typename T>
inline float dot(const float* a, const T* b, int64_t dim) {
  Vec8 acc = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) acc += load8(a + d) * load8(b + d);
  for (int64_t l = 0; d + l < dim; ++l) acc[l] += a[d + l] * as_float(b[d + l]);
  return lane_sum(acc);
}

// Four dot products of `a` with rows b0..b3, each summed exactly as dot() sums it
// (four independent chains, so the additions overlap).
template <typename T>
inline void dot4(const float* a, const T* b0, const T* b1, const T* b2, const T* b3,
                 int64_t dim, float* out) {
  Vec8 acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    const Vec8 x = load8(a + d);
    acc0 += x * load8(b0 + d);
    acc1 += x * load8(b1 + d);
    acc2 += x * load8(b2 + d);
    acc3 += x * load8(b3 + d);
  }
  for (int64_t l = 0; d + l < dim; ++l) {
    acc0[l] += a[d + l] * as_float(b0[d + l]);
    acc1[l] += a[d + l] * as_float(b1[d + l]);
    acc2[l] += a[d + l] * as_float(b2[d + l]);
    acc3[l] += a[d + l] * as_float(b3[d + l]);
  }
  out[0] = lane_sum(acc0);
  out[1] = lane_sum(acc1);
  out[2] = lane_sum(acc2);
  out[3] = lane_sum(acc3);
}

// o[0:dim] += sum over t < count of w[t] * v[t * stride + 0:dim], t in order (each
// element summed exactly as repeated single updates would).
template <typename T>
inline void weighted_rows(float* o, const float* w, const T* v, int64_t stride,
                          int64_t count, int64_t dim) {
  int64_t d = 0;
  for (; d + 4 * kLanes <= dim; d += 4 * kLanes) {
    Vec8 a0 = load8(o + d), a1 = load8(o + d + 8), a2 = load8(o + d + 16), a3 = load8(o + d + 24);
    const T* row = v + d;
    for (int64_t t = 0; t < count; ++t, row += stride) {
      const float x = w[t];
      a0 += x * load8(row);
      a1 += x * load8(row + 8);
      a2 += x * load8(row + 16);
      a3 += x * load8(row + 24);
    }
    store8(o + d, a0); store8(o + d + 8, a1); store8(o + d + 16, a2); store8(o + d + 24, a3);
  }
  for (; d + kLanes <= dim; d += kLanes) {
    Vec8 a0 = load8(o + d);
    const T* row = v + d;
    for (int64_t t = 0; t < count; ++t, row += stride) a0 += w[t] * load8(row);
    store8(o + d, a0);
  }
  for (; d < dim; ++d) {
    float a0 = o[d];
    for (int64_t t = 0; t < count; ++t) a0 += w[t] * as_float(v[t * stride + d]);
    o[d] = a0;
  }
}

}  // namespace aioserve_cpu
