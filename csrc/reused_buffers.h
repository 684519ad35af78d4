// Output buffers reused from one call to the next on a thread (reused_buffers.cpp): the fused
// dot interaction's output and gradients (interaction.cpp) and the pooled forward lookup's
// output (embedding_forward.cpp).
//
// A fresh buffer of megabytes per call lands on pages the process has to fault in again
// whenever the allocator hands back memory it returned to the system or its free chunks shift
// between calls; each first touch of a page is a page fault, and the kernel zeroes the page.
// Measured on AMD EPYC Zen 5 (26/2/1), one thread, 2026-12-05 (docs/benchmarks.md): the
// pooled lookup's (4096, 512) fp32 output, 8 MB, took 516 page faults and 0.7-1.2 ms of system
// time every call under glibc's default settings (neo.host_memory.retain_freed_memory() hides
// most of it), a third of the forward's time over 8 tables of 1M rows; the interaction's
// backward at B 2048, D 128 took 8 to 23 ms instead of 5 (4 to 27 MB faulted in).
//
// A slot keeps a storage, not a tensor: the returned tensor is the only one, so autograd still
// takes it as .grad without copying (AccumulateGrad steals a gradient only when nothing else
// holds the tensor). A storage is handed out again only when its slot alone holds it
// (held_by_slot_alone) and it has the size wanted. A call site keeps several slots: the
// previous call's output is often still held when the next call starts (an activation until
// the step's backward, a loop variable until reassigned), and shapes called in turn (two
// modules, training and evaluation batches, a rank's table groups) keep a slot each. A new
// storage takes an empty slot first, then one nobody else holds (its storage, of another size,
// freed), else the last slot. What the slots keep stays allocated until the thread ends: at
// most one buffer a slot, of the sizes last called.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace neo {

struct Slots {
  explicit Slots(size_t n) : s(n) {}
  std::vector<c10::Storage> s;
};

// A contiguous fp32 tensor of `sizes` on a storage from `slots` that nothing else holds any more,
// or on a new one (then kept in a slot). Its contents are not initialised. Buffers of 2 MiB or
// more start on a 2 MiB boundary of their storage, on transparent huge pages where available.
at::Tensor reused_or_empty(Slots& slots, at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace neo
