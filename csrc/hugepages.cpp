// Transparent huge pages for the large weight / state buffers.
//
// Lookups hit random rows of tables of gigabytes: with 4 KiB pages nearly every row is a
// TLB miss (and a page walk, nested under virtualization). Where THP is in "madvise" mode,
// marking the buffer MADV_HUGEPAGE makes new faults use 2 MiB pages, and MADV_COLLAPSE
// (Linux >= 6.1) converts the already populated pages now. Best effort: on failure
// nothing changes but speed. Only the 2 MiB-aligned interior of the buffer is advised.
#include "hugepages.h"

#include <fstream>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <cstdint>

namespace neo {

bool advise_hugepages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t end = begin + static_cast<uintptr_t>(t.numel()) * t.element_size();
  const uintptr_t a = (begin + kHuge - 1) & ~(kHuge - 1), b = end & ~(kHuge - 1);
  if (b <= a) return false;
  if (madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE) != 0) return false;
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
  return madvise(reinterpret_cast<void*>(a), b - a, MADV_COLLAPSE) == 0;
#else
  (void)t;
  return false;
#endif
}

bool transparent_hugepages_available() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool available = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    return static_cast<bool>(std::getline(f, mode)) && mode.find("[never]") == std::string::npos;
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace neo
