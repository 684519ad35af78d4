// Transparent huge pages for large CPU buffers (hugepages.cpp).
#pragma once

#include <ATen/ATen.h>

namespace neo {

// Marks the 2 MiB-aligned interior of t's bytes MADV_HUGEPAGE and collapses its populated
// pages into 2 MiB pages (MADV_COLLAPSE, Linux >= 6.1). Best effort: false where not done.
bool advise_hugepages(const at::Tensor& t);

// Whether transparent huge pages are available to madvise (Linux, not "never").
bool transparent_hugepages_available();

}  // namespace neo
