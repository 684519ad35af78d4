// The vector vocabulary of one ISA variant, and its register blocking.
//
// Included by every kernel header; in namespace neo::<isa> (isa_ns.h). Which branch compiles
// depends on the variant's flags (csrc/isa/kernels_<isa>.cpp, setup.py):
//
//   AVX-512   16 floats a vector, 32 registers
//   AVX2       8 floats a vector, 16 registers (FMA, F16C)
//   baseline   4 floats a vector (GCC vector extensions: SSE2 on x86-64, NEON on aarch64)
//
// Arithmetic is the plain IEEE operation of each intrinsic; the kernel files are compiled
// with -ffp-contract=off, so a mul followed by an add stays two roundings (the embedding
// kernels match the reference bit for bit) and a fused multiply-add happens only where
// vfmadd is written (the dot interaction, which is tolerance-tested).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "isa_ns.h"

NEO_KERNELS_BEGIN

// Full unrolling of a loop over a tile's compile-time rows or columns, so that its array of
// vector sums lives in registers (gcc keeps a partly unrolled one in memory).
#define NEO_UNROLL _Pragma("GCC unroll 32")

#if defined(__AVX512F__)
// ------------------------------------------------------------------------------ AVX-512
constexpr int kW = 16;
typedef __m512 vf;
typedef __m512i vi;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vload(const c10::Half* p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline vf vload(const c10::BFloat16* p) {   // maskz forms: gcc 12 warns on the plain ones' undefined operand
  const __m512i w = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16));
}
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline void vstream(float* p, vf v) { _mm512_stream_ps(p, v); }
inline void vsfence() { _mm_sfence(); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vsqrt(vf a) { return _mm512_maskz_sqrt_ps(0xFFFF, a); }   // maskz: see vload
inline vf vfmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vi vizero() { return _mm512_setzero_si512(); }
inline vi viload(const void* p) { return _mm512_loadu_si512(p); }
inline vi viadd(vi a, vi b) { return _mm512_add_epi32(a, b); }
// Register blocking (32 registers).
constexpr int kVecRegs = 32;
constexpr int kPoolMaxNV = 16;   // forward: a bag's sum held in up to 16 vectors (D <= 256)
constexpr int kFwdR = 4, kFwdC = 4;   // interaction forward: 4 x 4 pair dots (16 sums + 8 operands, 8 floats each)
constexpr int kTallR = 5;             // "tall" tiles, 5 x kFwdC: 20 sums + 5 + 4 operands (29 registers);
                                      // kTallR <= kFwdC + 1, so that the diagonal tile reaches every row's first pair
constexpr int kBwdR = 6, kBwdC = 4;   // interaction backward: 6 rows x 4 vectors (24 sums + 4 + 1)
#elif defined(__AVX2__)
// ------------------------------------------------------------------------------ AVX2
constexpr int kW = 8;
typedef __m256 vf;
typedef __m256i vi;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float x) { return _mm256_set1_ps(x); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline vf vload(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vf vload(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline void vstream(float* p, vf v) { _mm256_stream_ps(p, v); }
inline void vsfence() { _mm_sfence(); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vsqrt(vf a) { return _mm256_sqrt_ps(a); }
inline vf vfmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vi vizero() { return _mm256_setzero_si256(); }
inline vi viload(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline vi viadd(vi a, vi b) { return _mm256_add_epi32(a, b); }
// Register blocking (16 registers: AVX-512's blocks would spill here).
constexpr int kVecRegs = 16;
constexpr int kPoolMaxNV = 8;    // D <= 64 in one pass over the bag, wider D in passes of 64 columns
constexpr int kFwdR = 2, kFwdC = 4;   // 8 sums (one 8-way reduction) + 6 operands
constexpr int kTallR = 3;             // "tall" tiles, 3 x kFwdC: 12 sums + 3 row operands + 1 column operand at a time
constexpr int kBwdR = 6, kBwdC = 2;   // 12 sums + 2 + 1
#else
// ------------------------------------------------------------------------------ baseline
constexpr int kW = 4;
typedef float vf __attribute__((vector_size(16)));
typedef uint32_t vi __attribute__((vector_size(16)));
typedef uint16_t vh __attribute__((vector_size(8)));
inline vf vzero() { return vf{0.0f, 0.0f, 0.0f, 0.0f}; }
inline vf vset1(float x) { return vf{x, x, x, x}; }
inline vf vload(const float* p) { vf v; std::memcpy(&v, p, sizeof(v)); return v; }
inline vi widen16(const void* p) {  // 4 x uint16 -> 4 x uint32, shifted into the top half
  vh h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, vi) << 16;
}
inline vf as_vf(vi x) { vf v; std::memcpy(&v, &x, sizeof(v)); return v; }
inline vi as_vi(vf x) { vi v; std::memcpy(&v, &x, sizeof(v)); return v; }
inline vf vload(const c10::BFloat16* p) { return as_vf(widen16(p)); }
// IEEE half -> float without F16C, exact for every input (normal, subnormal, inf, NaN): the
// bit manipulation of c10::detail::fp16_ieee_to_fp32_value, four lanes at a time.
inline vf vload(const c10::Half* p) {
  const vi w = widen16(p);
  const vi sign = w & 0x80000000u;
  const vi two_w = w + w;
  const vf normalized = as_vf((two_w >> 4) + (0xE0u << 23)) * vset1(0x1.0p-112f);
  const vf denormalized = as_vf((two_w >> 17) | 0x3F000000u) - vset1(0.5f);
  const vi tiny = (vi)((two_w >> 27) == 0);   // all-ones where the input is zero or subnormal
  return as_vf(sign | ((as_vi(denormalized) & tiny) | (as_vi(normalized) & ~tiny)));
}
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline void vstream(float* p, vf v) { vstore(p, v); }
inline void vsfence() {}
inline vf vadd(vf a, vf b) { return a + b; }
inline vf vmul(vf a, vf b) { return a * b; }
inline vf vdiv(vf a, vf b) { return a / b; }
inline vf vsub(vf a, vf b) { return a - b; }
inline vf vsqrt(vf a) { return vf{std::sqrt(a[0]), std::sqrt(a[1]), std::sqrt(a[2]), std::sqrt(a[3])}; }
inline vf vfmadd(vf a, vf b, vf c) { return a * b + c; }   // two roundings (no FMA in the baseline ISA)
inline vi vizero() { return vi{0, 0, 0, 0}; }
inline vi viload(const void* p) { vi v; std::memcpy(&v, p, sizeof(v)); return v; }
inline vi viadd(vi a, vi b) { return a + b; }
constexpr int kVecRegs = 16;          // SSE2's 16 (NEON has 32; the same blocks serve)
constexpr int kPoolMaxNV = 8;         // 32 columns a pass
constexpr int kFwdR = 2, kFwdC = 4;
constexpr int kTallR = kFwdR;         // no tall tiles here
constexpr int kBwdR = 6, kBwdC = 2;
#endif

// Pair-dot vectors (the interaction forward's tiles end in horizontal sums): 8 floats on
// AVX2 and AVX-512 (where the tiles use all 32 registers and an 8-way reduction tree
// needs no folding of 16-float vectors), 4 on the baseline; AVX-512's wide tiles use
// 16-float vectors and hsum16 instead (interaction.h).
// An empty asm that claims to modify v: the compiler must hold v in a register here.
template <typename V>
inline void keep_in_register(V& v) { __asm__("" : "+x"(v)); }

#if defined(__AVX2__)
constexpr int kPW = 8;
typedef __m256 pv;
inline pv pzero() { return _mm256_setzero_ps(); }
inline pv pload(const float* p) { return _mm256_loadu_ps(p); }
inline pv pfmadd(pv a, pv b, pv c) { return _mm256_fmadd_ps(a, b, c); }
// Eight horizontal sums with a transposing tree of horizontal adds: out[q] = sum of a[q].
inline void hsum8(const pv* a, float* out) {
  const __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));   // s0..s3 per half
  const __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));   // s4..s7 per half
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31)));
}
#if defined(__AVX512F__)
// Sixteen horizontal sums of 16-float vectors into one vector: lane q = sum of a[q]. Four
// halving stages (256-bit halves, 128-bit quarters, pairs, single lanes), each adding the
// two halves of two vectors: 30 shuffles and 15 adds. The inputs enter in the order kIn,
// the permutation the stages apply to lanes (its own inverse), so the lanes come out in
// order.
inline __m512 hsum16(const __m512* a) {
  constexpr int kIn[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
  __m512 s1[8], s2[4], s3[2];
  NEO_UNROLL
  for (int q = 0; q < 8; ++q) {
    const __m512 x = a[kIn[q]], y = a[kIn[q + 8]];
    s1[q] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
  }
  NEO_UNROLL
  for (int q = 0; q < 4; ++q)
    s2[q] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[q], s1[q + 4], 0x88), _mm512_shuffle_f32x4(s1[q], s1[q + 4], 0xDD));
  NEO_UNROLL
  for (int q = 0; q < 2; ++q) {
    const __m512d x = _mm512_castps_pd(s2[q]), y = _mm512_castps_pd(s2[q + 2]);
    s3[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif
#else
constexpr int kPW = kW;
typedef vf pv;
inline pv pzero() { return vzero(); }
inline pv pload(const float* p) { return vload(p); }
inline pv pfmadd(pv a, pv b, pv c) { return vfmadd(a, b, c); }
inline void hsum8(const pv* a, float* out) {
  for (int q = 0; q < 8; ++q) out[q] = (a[q][0] + a[q][1]) + (a[q][2] + a[q][3]);
}
#endif

// Every 64-byte line of [p, p + bytes): WRITE = with write intent; LOCALITY 3 = into L1,
// 1 = into L2 only (the far prefetches, which keep more misses in flight).
template <int WRITE, int LOCALITY>
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, WRITE, LOCALITY);
}
inline void prefetch_row(const void* p, int64_t bytes) { prefetch_lines<0, 3>(p, bytes); }
inline void prefetch_row_w(const void* p, int64_t bytes) { prefetch_lines<1, 3>(p, bytes); }
inline void prefetch_row_l2(const void* p, int64_t bytes) { prefetch_lines<0, 1>(p, bytes); }
inline void prefetch_row_w_l2(const void* p, int64_t bytes) { prefetch_lines<1, 1>(p, bytes); }

// Read prefetches of every 64-byte line of [p, p + bytes) that the compiler must keep, into L1
// (Locality 3: prefetcht0) or L2 (Locality 1: prefetcht2): an asm statement on x86-64
// (prefetcht* are SSE, so every variant), __builtin_prefetch elsewhere. gcc 12 (-O2 and -O3)
// deletes a loop of __builtin_prefetch whose addresses are loaded from a local array of
// pointers, as if it did nothing: the dot interaction's prefetches of the next sample's rows
// (csrc/kernels/interaction.h) were compiled to nothing that way.
template <int Locality>
inline void prefetch_lines_kept(const void* p, int64_t bytes) {
  static_assert(Locality == 1 || Locality == 3, "L2 (1) or L1 (3)");
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) {
#if defined(__x86_64__)
    if constexpr (Locality == 3) __asm__ volatile("prefetcht0 %0" : : "m"(c[o]));
    else __asm__ volatile("prefetcht2 %0" : : "m"(c[o]));
#else
    __builtin_prefetch(c + o, 0, Locality);
#endif
  }
}
inline void prefetch_lines_l2_kept(const void* p, int64_t bytes) { prefetch_lines_kept<1>(p, bytes); }
inline void prefetch_lines_l1_kept(const void* p, int64_t bytes) { prefetch_lines_kept<3>(p, bytes); }

NEO_KERNELS_END
