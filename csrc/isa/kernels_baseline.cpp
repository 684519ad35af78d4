// The baseline variant of the kernels: the compiler's default target (x86-64: SSE2;
// aarch64: NEON), no other instruction-set flags (setup.py). Runs on every CPU.
#if defined(__AVX__) && !defined(NEO_NATIVE_BUILD)
#error "kernels_baseline.cpp must be compiled for the baseline ISA (no -mavx*, no -march=native): see setup.py"
#endif
#define NEO_ISA baseline
#include "../kernels/variant.h"
