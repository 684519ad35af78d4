// Stochastic rounding fp32 -> fp16/bf16, bit-identical to neo.embedding.backends.reference
// (sr_uniform + round_weights): a splitmix64 hash of (seed, step, flat element index) gives a
// uniform u in [0, 1) with 24 random bits (the key of (seed, step) is made by the entry
// point, embedding_backward.cpp); the neighbour `other` of the nearest value `r` on x's side
// is taken when u < p = (x - r) / (other - r), all in fp32 in the reference's order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "isa_ns.h"

NEO_KERNELS_BEGIN

constexpr uint64_t kSrElem = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kSrMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kSrMix2 = 0x94D049BB133111EBULL;

inline float sr_uniform(uint64_t key, uint64_t elem) {
  uint64_t z = (elem * kSrElem) ^ key;
  z = (z ^ (z >> 30)) * kSrMix1;
  z = (z ^ (z >> 27)) * kSrMix2;
  z = z ^ (z >> 31);
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
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
  const float p = diff / (o32 - r32);
  return (u < p) ? other : r;
}

NEO_KERNELS_END
