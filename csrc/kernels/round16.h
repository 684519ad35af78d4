// fp32 -> fp16 / bf16 row stores, eight (AVX2) or sixteen (AVX-512) elements at a time,
// bit-identical to the scalar rules of stochastic_rounding.h (round_stochastic, sr_uniform_low)
// and to c10's nearest-even conversions (fp16: the F16C instruction c10 itself uses when
// compiled with F16C; bf16: c10's bias-and-shift, NaN -> 0x7FC0).
//
// Why: the scalar stochastic rounding costs a hash and an unpredictable branch (u < p) per
// element; fused Adam / row-wise Adagrad on fp16 tables spent most of their time there.
// Here the hash's 64-bit part runs once per row and its 32-bit part (two 32-bit
// multiplies) on eight lanes (sixteen on AVX-512), and the choice is a multiply, a compare
// and a blend. The baseline variant keeps the scalar loop.
//
// (The hash was splitmix64 of the whole 64-bit index until 2026-11-28: three 64-bit
// multiplies per element, nine 32-bit ones under AVX2, plus a division for p; row-wise
// Adagrad on fp16 tables then spent more time rounding than in the rest of its update.)
#pragma once

#include "stochastic_rounding.h"
#include "util.h"

NEO_KERNELS_BEGIN

#if defined(__AVX2__)

// GCC vectors of eight 32-bit lanes: the width-generic rules below are written once on them.
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32v8 __attribute__((vector_size(32)));

// The reference's sr_uniform(key, e) for the W elements e = hi 2^32 + lo0 + i, i < W (lo0 + W - 1 < 2^32),
// given low_key = sr_low_key(key, hi): sr_mix32 on W 32-bit lanes (U a GCC vector of W
// uint32), then z >> 8 in fp32 (exact: 24 bits, converted as signed integers).
template <typename U, typename I, typename F>
inline F sr_uniform_lanes(uint32_t low_key, uint32_t lo0) {
  U lanes;
  for (int i = 0; i < static_cast<int>(sizeof(U) / 4); ++i) lanes[i] = static_cast<uint32_t>(i);
  const U z = sr_mix32((lo0 + lanes) ^ low_key) >> 8;
  return __builtin_convertvector(reinterpret_cast<const I&>(z), F) * (1.0f / 16777216.0f);
}
inline __m256 sr_uniform8(uint32_t low_key, uint32_t lo0) {
  return reinterpret_cast<__m256>(sr_uniform_lanes<u32x8, i32x8, f32v8>(low_key, lo0));
}

// c10's fp32 -> bf16 nearest even on W lanes (bias and shift; NaN -> 0x7FC0): 16-bit patterns
// in 32-bit lanes (U, I, F: GCC vectors of W uint32, int32, float).
template <typename U, typename I, typename F>
inline U bf16_bits_lanes(F x) {
  const U u = reinterpret_cast<const U&>(x);
  const U r = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
  const U nan = reinterpret_cast<const U&>(static_cast<const I&>(x != x));
  return (r & ~nan) | (nan & 0x7FC0u);
}

// Nearest-even 16-bit patterns of x, packed (eight 16-bit lanes), and their fp32 values.
inline __m128i round16(__m256 x, c10::Half*) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline __m128i round16(__m256 x, c10::BFloat16*) {
  const u32x8 bits = bf16_bits_lanes<u32x8, i32x8, f32v8>(reinterpret_cast<const f32v8&>(x));   // < 2^16: exact pack
  const __m256i b = reinterpret_cast<const __m256i&>(bits);
  return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}
inline __m256 widen16(__m128i bits, c10::Half*) { return _mm256_cvtph_ps(bits); }
inline __m256 widen16(__m128i bits, c10::BFloat16*) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// Eight 32-bit masks (all ones or zero) as eight 16-bit masks.
inline __m128i narrow_mask(__m256i m) {
  return _mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
}

// round_stochastic for eight lanes (16-bit patterns, packed): the neighbour `other` of
// r = nearest(x) on x's side is taken when u < p = (x - r) / (other - r), tested as
// |u (other - r)| < |x - r|. That one ordered compare also keeps r wherever the scalar rule
// does: x exact (|x - r| = 0), x NaN (a NaN operand), r infinite (|x - r| = inf, and
// |u (other - r)| inf or NaN) or other infinite (|x - r| finite, the product inf or NaN).
template <typename T>
inline __m128i round_stochastic8(__m256 x, __m256 u) {
  const __m128i r = round16(x, static_cast<T*>(nullptr));
  const __m256 r32 = widen16(r, static_cast<T*>(nullptr));
  const __m256 diff = _mm256_sub_ps(x, r32);
  // next_toward(r, x > r), in 16-bit lanes: r -+ 1 toward or away from zero; from zero to the
  // smallest subnormal of x's side. (A NaN diff reads as either side: never taken below.)
  const __m128i down = narrow_mask(_mm256_srai_epi32(_mm256_castps_si256(diff), 31));   // x < r
  const __m128i r_neg = _mm_srai_epi16(r, 15);
  const __m128i stepped = _mm_add_epi16(r, _mm_or_si128(_mm_xor_si128(r_neg, down), _mm_set1_epi16(1)));
  const __m128i from_zero = _mm_or_si128(_mm_and_si128(down, _mm_set1_epi16(static_cast<short>(0x8000))), _mm_set1_epi16(1));
  const __m128i zero = _mm_cmpeq_epi16(_mm_and_si128(r, _mm_set1_epi16(0x7FFF)), _mm_setzero_si128());
  const __m128i other = _mm_blendv_epi8(stepped, from_zero, zero);
  const __m256 o32 = widen16(other, static_cast<T*>(nullptr));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 scaled = _mm256_and_ps(_mm256_mul_ps(u, _mm256_sub_ps(o32, r32)), abs_mask);   // |u (other - r)|
  const __m256 take = _mm256_cmp_ps(scaled, _mm256_and_ps(diff, abs_mask), _CMP_LT_OQ);
  return _mm_blendv_epi8(r, other, narrow_mask(_mm256_castps_si256(take)));
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// The same, sixteen lanes at a time: 512-bit fp32 lanes, 256-bit 16-bit lanes, mask registers
// for the choices. (Written once for both widths on GCC vector types, the rule compiled to
// mask round trips through vectors: fp16 row-wise Adagrad 1.4-1.6x slower on AVX-512 and
// 1.05-1.2x on AVX2, alternating processes, docs/benchmarks.md. So each width keeps its
// intrinsics.)
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef float f32v16 __attribute__((vector_size(64)));
inline __m512 sr_uniform16(uint32_t low_key, uint32_t lo0) {
  return reinterpret_cast<__m512>(sr_uniform_lanes<u32x16, i32x16, f32v16>(low_key, lo0));
}

inline __m256i round16x16(__m512 x, c10::Half*) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline __m256i round16x16(__m512 x, c10::BFloat16*) {
  const u32x16 bits = bf16_bits_lanes<u32x16, i32x16, f32v16>(reinterpret_cast<const f32v16&>(x));
  return _mm512_cvtepi32_epi16(reinterpret_cast<const __m512i&>(bits));
}
inline __m512 widen16x16(__m256i bits, c10::Half*) { return _mm512_cvtph_ps(bits); }
inline __m512 widen16x16(__m256i bits, c10::BFloat16*) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

template <typename T>
inline __m256i round_stochastic16(__m512 x, __m512 u) {
  const __m256i r = round16x16(x, static_cast<T*>(nullptr));
  const __m512 r32 = widen16x16(r, static_cast<T*>(nullptr));
  const __m512 diff = _mm512_sub_ps(x, r32);
  const __m256i down = _mm256_movm_epi16(_mm512_cmp_ps_mask(diff, _mm512_setzero_ps(), _CMP_LT_OQ));   // x < r
  const __m256i r_neg = _mm256_srai_epi16(r, 15);
  const __m256i stepped = _mm256_add_epi16(r, _mm256_or_si256(_mm256_xor_si256(r_neg, down), _mm256_set1_epi16(1)));
  const __m256i from_zero = _mm256_or_si256(_mm256_and_si256(down, _mm256_set1_epi16(static_cast<short>(0x8000))),
                                            _mm256_set1_epi16(1));
  const __mmask16 zero = _mm256_testn_epi16_mask(r, _mm256_set1_epi16(0x7FFF));
  const __m256i other = _mm256_mask_blend_epi16(zero, stepped, from_zero);
  const __m512 o32 = widen16x16(other, static_cast<T*>(nullptr));
  const __m512 scaled = _mm512_abs_ps(_mm512_mul_ps(u, _mm512_sub_ps(o32, r32)));   // |u (other - r)|
  return _mm256_mask_blend_epi16(_mm512_cmp_ps_mask(scaled, _mm512_abs_ps(diff), _CMP_LT_OQ), r, other);
}
#endif

template <typename T>
inline void store_row16(T* w, const float* wf, int64_t D, bool stochastic, uint64_t key, int64_t elem0) {
  // The row's element indices share their high half (all but one row in 2^32 / D): the
  // 64-bit part of the hash once, the 32-bit part eight lanes at a time. Otherwise scalar.
  const uint64_t e0 = static_cast<uint64_t>(elem0);
  const uint32_t lo0 = static_cast<uint32_t>(e0);
  const bool one_high = static_cast<uint64_t>(lo0) + static_cast<uint64_t>(D) <= (uint64_t{1} << 32);
  const int64_t nv = (stochastic && !one_high) ? 0 : D / 8 * 8;
  const uint32_t low_key = (stochastic && one_high) ? sr_low_key(key, e0 >> 32) : 0;
  int64_t d = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (; d + 16 <= nv; d += 16) {
    const __m512 x = _mm512_loadu_ps(wf + d);
    const __m256i bits = stochastic ? round_stochastic16<T>(x, sr_uniform16(low_key, lo0 + static_cast<uint32_t>(d)))
                                    : round16x16(x, static_cast<T*>(nullptr));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + d), bits);
  }
#endif
  for (; d < nv; d += 8) {
    const __m256 x = _mm256_loadu_ps(wf + d);
    const __m128i bits = stochastic ? round_stochastic8<T>(x, sr_uniform8(low_key, lo0 + static_cast<uint32_t>(d)))
                                    : round16(x, static_cast<T*>(nullptr));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w + d), bits);
  }
  if (stochastic) {
    store_row16_stochastic_scalar(w, wf, nv, D, key, elem0);
  } else {
    for (d = nv; d < D; ++d) w[d] = T(wf[d]);
  }
}

#else

template <typename T>
inline void store_row16(T* w, const float* wf, int64_t D, bool stochastic, uint64_t key, int64_t elem0) {
  if (stochastic) {
    store_row16_stochastic_scalar(w, wf, 0, D, key, elem0);
  } else {
    for (int64_t d = 0; d < D; ++d) w[d] = T(wf[d]);
  }
}

#endif

NEO_KERNELS_END
