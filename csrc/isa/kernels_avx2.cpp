// The AVX2 variant of the kernels (x86-64: -mavx2 -mfma -mf16c, setup.py). Chosen at run
// time on CPUs with AVX2, FMA and F16C (Intel Haswell and later, AMD Zen and later).
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__) || (defined(__AVX512F__) && !defined(NEO_NATIVE_BUILD))
#error "kernels_avx2.cpp must be compiled with -mavx2 -mfma -mf16c and without AVX-512: see setup.py"
#endif
#define NEO_ISA avx2
#include "../kernels/variant.h"
