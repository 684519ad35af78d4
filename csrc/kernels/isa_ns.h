// The namespace of one ISA variant's kernels: neo::<isa>::(anonymous). Every kernel header
// wraps its code in NEO_KERNELS_BEGIN / NEO_KERNELS_END, so each variant's functions (and
// every template instantiated with them) are distinct symbols with internal linkage; the
// only symbol a variant exports is neo::<isa>::kernel_table() (variant.h).
#pragma once

#ifndef NEO_ISA
#error "csrc/kernels/ is compiled once per ISA: include it from csrc/isa/kernels_<isa>.cpp, which defines NEO_ISA"
#endif

#define NEO_KERNELS_BEGIN \
  namespace neo {         \
  namespace NEO_ISA {     \
  namespace {
#define NEO_KERNELS_END \
  }                     \
  }                     \
  }
