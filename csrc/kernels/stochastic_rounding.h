// Stochastic rounding fp32 -> fp16/bf16, bit-identical to neo.embedding.backends.reference
// (sr_uniform + round_weights). A uniform u in [0, 1) with 24 random bits per flat element
// index e = hi 2^32 + lo: a 64-bit key of (seed, step) (made by the entry point,
// embedding_backward.cpp) and hi through the splitmix64 finalizer (once per row in the
// vector code), then a 32-bit hash (lowbias32) of lo with that key's low half. The
// neighbour `other` of the nearest value `r` on x's side is taken when u < p = (x - r) /
// (other - r), tested as |u (other - r)| < |x - r| (other - r is a power of two: no
// division), all in fp32 in the reference's order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "isa_ns.h"

NEO_KERNELS_BEGIN

constexpr uint64_t kSrHigh = 0xD6E8FEB86659FD93ULL;
constexpr uint64_t kSrMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kSrMix2 = 0x94D049BB133111EBULL;
constexpr uint32_t kSrLow1 = 0x7FEB352Du;
constexpr uint32_t kSrLow2 = 0x846CA68Bu;

// The 32-bit key of the elements whose index has high half `hi`.
inline uint32_t sr_low_key(uint64_t key, uint64_t hi) {
  uint64_t k = (hi * kSrHigh) ^ key;
  k = (k ^ (k >> 30)) * kSrMix1;
  k = (k ^ (k >> 27)) * kSrMix2;
  k = k ^ (k >> 31);
  return static_cast<uint32_t>(k);
}

// lowbias32 of z: on a uint32_t, or lane by lane on a GCC vector of them (round16.h).
template <typename U>
inline U sr_mix32(U z) {
  z = (z ^ (z >> 16)) * kSrLow1;
  z = (z ^ (z >> 15)) * kSrLow2;
  return z ^ (z >> 16);
}

// The reference's sr_uniform(key, e) for the element e whose low half is `lo`, given
// low_key = sr_low_key(key, e's high half).
inline float sr_uniform_low(uint32_t low_key, uint32_t lo) {
  return static_cast<float>(sr_mix32(lo ^ low_key) >> 8) * (1.0f / 16777216.0f);
}

template <typename T>
inline uint16_t bits16(T v) { uint16_t b; std::memcpy(&b, &v, 2); return b; }
template <typename T>
inline T from_bits16(uint16_t b) { T v; std::memcpy(&v, &b, 2); return v; }

// The 16-bit float next to r toward +inf (up) or -inf.
template <typename T>
inline T next_toward(T r, bool up) {
  const uint32_t bits = bits16(r);
  const uint32_t mag = bits & 0x7FFF;
  const bool negative = (bits & 0x8000) != 0;
  uint32_t nb;
  if (mag == 0) nb = up ? 0x0001 : 0x8001;
  else nb = (negative != up) ? bits + 1 : bits - 1;
  return from_bits16<T>(static_cast<uint16_t>(nb & 0xFFFF));
}

template <typename T>  // T = c10::Half or c10::BFloat16
inline T round_stochastic(float x, float u) {
  const T r = T(x);                              // nearest even, as torch's .to()
  const float r32 = static_cast<float>(r);
  const float diff = x - r32;
  if (!(diff != 0.0f)) return r;
  const T other = next_toward(r, diff > 0.0f);
  const float o32 = static_cast<float>(other);
  if (!std::isfinite(r32) || !std::isfinite(o32)) return r;
  return (std::fabs(u * (o32 - r32)) < std::fabs(diff)) ? other : r;
}

// Elements [d0, D) of a row stored stochastically one at a time (the baseline variant, the
// vector variants' tails and rows straddling a multiple of 2^32): the hash's 64-bit part
// only where the element index's high half changes, not per element.
template <typename T>
inline void store_row16_stochastic_scalar(T* w, const float* wf, int64_t d0, int64_t D, uint64_t key,
                                          int64_t elem0) {
  uint64_t hi = ~uint64_t{0};   // no index has this high half: the first element computes the key
  uint32_t low_key = 0;
  for (int64_t d = d0; d < D; ++d) {
    const uint64_t e = static_cast<uint64_t>(elem0 + d);
    if ((e >> 32) != hi) {
      hi = e >> 32;
      low_key = sr_low_key(key, hi);
    }
    w[d] = round_stochastic<T>(wf[d], sr_uniform_low(low_key, static_cast<uint32_t>(e)));
  }
}

NEO_KERNELS_END
