// The AVX-512 variant of the kernels (x86-64: AVX2's flags plus -mavx512f -mavx512bw
// -mavx512vl -mavx512dq, setup.py). Chosen at run time on CPUs with those (Intel Skylake-SP
// and later, AMD Zen 4 and later) where the OS saves the AVX-512 state.
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512DQ__)
#error "kernels_avx512.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq: see setup.py"
#endif
#define NEO_ISA avx512
#include "../kernels/variant.h"
