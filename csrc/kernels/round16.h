// fp32 -> fp16 / bf16 row stores, eight elements at a time (AVX2 and AVX-512 variants),
// bit-identical to the scalar rules of stochastic_rounding.h (round_stochastic, sr_uniform)
// and to c10's nearest-even conversions (fp16: the F16C instruction c10 itself uses when
// compiled with F16C; bf16: c10's bias-and-shift, NaN -> 0x7FC0).
//
// Why: the scalar stochastic rounding costs a 64-bit hash (three 64-bit multiplies) and an
// unpredictable branch (u < p) per element; fused Adam / row-wise Adagrad on fp16 tables
// spent most of their time there. Here the hash runs on four 64-bit lanes per register
// (AVX-512DQ: vpmullq; AVX2: three 32-bit multiplies per 64-bit product) and the choice is
// a blend. The baseline variant keeps the scalar loop.
#pragma once

#include "stochastic_rounding.h"
#include "util.h"

NEO_KERNELS_BEGIN

#if defined(__AVX2__)

// a * b mod 2^64 per 64-bit lane, b a constant.
inline __m256i mul64(__m256i a, uint64_t b) {
#if defined(__AVX512DQ__) && defined(__AVX512VL__)
  return _mm256_mullo_epi64(a, _mm256_set1_epi64x(static_cast<int64_t>(b)));
#else
  const __m256i bl = _mm256_set1_epi64x(static_cast<int64_t>(b & 0xFFFFFFFFu));
  const __m256i bh = _mm256_set1_epi64x(static_cast<int64_t>(b >> 32));
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), bl), _mm256_mul_epu32(a, bh));
  return _mm256_add_epi64(_mm256_mul_epu32(a, bl), _mm256_slli_epi64(cross, 32));
#endif
}

// sr_uniform(key, e) for four consecutive elements e0 .. e0 + 3, as 64-bit lanes (z >> 40).
inline __m256i sr_bits4(uint64_t key, uint64_t e0) {
  const __m256i e = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<int64_t>(e0)), _mm256_setr_epi64x(0, 1, 2, 3));
  __m256i z = _mm256_xor_si256(mul64(e, kSrElem), _mm256_set1_epi64x(static_cast<int64_t>(key)));
  z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), kSrMix1);
  z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), kSrMix2);
  z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
  return _mm256_srli_epi64(z, 40);
}

// The eight uniforms of elements e0 .. e0 + 7, in fp32 (24 random bits each, exact).
inline __m256 sr_uniform8(uint64_t key, uint64_t e0) {
  const __m256i lo = sr_bits4(key, e0), hi = sr_bits4(key, e0 + 4);
  // the low 32 bits of every 64-bit lane, in element order
  const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m128i a = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(lo, idx));
  const __m128i b = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(hi, idx));
  const __m256i u24 = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(u24), _mm256_set1_ps(1.0f / 16777216.0f));
}

// Nearest-even 16-bit patterns of x (zero-extended to 32-bit lanes) and their fp32 values.
inline __m256i round16(__m256 x, c10::Half*) {
  return _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline __m256i round16(__m256 x, c10::BFloat16*) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)),
                                        _mm256_set1_epi32(0x7FFF));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}
inline __m256 widen16(__m256i bits, c10::Half*) {
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  return _mm256_cvtph_ps(packed);
}
inline __m256 widen16(__m256i bits, c10::BFloat16*) { return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)); }

inline __m256 is_finite8(__m256 v) {   // all-ones where |v| < inf
  return _mm256_cmp_ps(_mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))),
                       _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
}

// round_stochastic for eight lanes: the neighbour of r = nearest(x) on x's side is taken
// when u < p = (x - r) / (other - r); non-finite r or other, and exact x, keep r.
template <typename T>
inline __m256i round_stochastic8(__m256 x, __m256 u) {
  const __m256i r = round16(x, static_cast<T*>(nullptr));
  const __m256 r32 = widen16(r, static_cast<T*>(nullptr));
  const __m256 diff = _mm256_sub_ps(x, r32);
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(diff, _mm256_setzero_ps(), _CMP_GT_OQ));
  // next_toward(r, up): away from zero (bits + 1) when the sign and the direction differ
  const __m256i negative = _mm256_cmpeq_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x8000));
  const __m256i away = _mm256_xor_si256(negative, up);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i stepped = _mm256_blendv_epi8(_mm256_sub_epi32(r, one), _mm256_add_epi32(r, one), away);
  const __m256i from_zero = _mm256_blendv_epi8(_mm256_set1_epi32(0x8001), one, up);
  const __m256i zero_mag = _mm256_cmpeq_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0x7FFF)), _mm256_setzero_si256());
  const __m256i other = _mm256_and_si256(_mm256_blendv_epi8(stepped, from_zero, zero_mag), _mm256_set1_epi32(0xFFFF));
  const __m256 o32 = widen16(other, static_cast<T*>(nullptr));
  const __m256 p = _mm256_div_ps(diff, _mm256_sub_ps(o32, r32));
  __m256 take = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_setzero_ps(), _CMP_NEQ_UQ), _mm256_cmp_ps(u, p, _CMP_LT_OQ));
  take = _mm256_and_ps(take, _mm256_and_ps(is_finite8(r32), is_finite8(o32)));
  return _mm256_blendv_epi8(r, other, _mm256_castps_si256(take));
}

// Eight 32-bit lanes holding 16-bit patterns -> eight 16-bit values at dst.
inline void store8x16(void* dst, __m256i bits) {
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(static_cast<__m128i*>(dst), packed);
}

template <typename T>
inline void store_row16(T* w, const float* wf, int64_t D, bool stochastic, uint64_t key, int64_t elem0) {
  const int64_t nv = D / 8 * 8;
  for (int64_t d = 0; d < nv; d += 8) {
    const __m256 x = _mm256_loadu_ps(wf + d);
    store8x16(w + d, stochastic ? round_stochastic8<T>(x, sr_uniform8(key, static_cast<uint64_t>(elem0 + d)))
                                : round16(x, static_cast<T*>(nullptr)));
  }
  for (int64_t d = nv; d < D; ++d)
    w[d] = stochastic ? round_stochastic<T>(wf[d], sr_uniform(key, static_cast<uint64_t>(elem0 + d))) : T(wf[d]);
}

#else

template <typename T>
inline void store_row16(T* w, const float* wf, int64_t D, bool stochastic, uint64_t key, int64_t elem0) {
  if (stochastic) {
    for (int64_t d = 0; d < D; ++d)
      w[d] = round_stochastic<T>(wf[d], sr_uniform(key, static_cast<uint64_t>(elem0 + d)));
  } else {
    for (int64_t d = 0; d < D; ++d) w[d] = T(wf[d]);
  }
}

#endif

NEO_KERNELS_END
