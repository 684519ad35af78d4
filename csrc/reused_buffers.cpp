// Output buffers reused from one call to the next on a thread (reused_buffers.h says why and
// how).
#include "reused_buffers.h"

#include <Python.h>

#include <cstdint>

#include "hugepages.h"

namespace neo {
namespace {

// Whether Python object o has weak references (weakref.ref, a WeakValueDictionary's entry):
// the list head CPython keeps at its type's tp_weaklistoffset (negative where the type
// manages its weak references, Python 3.12 on; the same address arithmetic).
bool has_python_weakrefs(PyObject* o) {
  const Py_ssize_t off = Py_TYPE(o)->tp_weaklistoffset;
  return off != 0 && *reinterpret_cast<PyObject* const*>(reinterpret_cast<const char*>(o) + off) != nullptr;
}

// Whether nothing but its slot holds storage s: no other strong or weak reference, or else
// only its Python object (`tensor.untyped_storage()`, made by torch.save, saved-tensor hooks
// and the like), which PyTorch keeps alive while C++ holds the storage (PyObject
// preservation: the object holds one strong reference) and which nothing in Python refers to
// any more, strongly (the test PyTorch's AccumulateGrad makes before it steals a gradient,
// torch::autograd::impl::is_tensor_stealable) or weakly (a weakref.ref to the object would
// still reach the bytes: PyTorch's test does not look). With unique() alone such a storage
// stayed in its slot for good, never handed out again: with every slot so pinned, each
// call allocated afresh. C++ weak references (StorageWeakRef's) count too. Refcounts are
// read without the GIL, as PyTorch's own test reads them: an object nothing refers to
// cannot gain a reference meanwhile.
bool held_by_slot_alone(const c10::Storage& s) {
  const size_t strong = s.use_count();
  if (strong == 2) {
    const c10::impl::PyObjectSlot* py = s.unsafeGetStorageImpl()->pyobj_slot();
    if (!py->has_unique_reference() || has_python_weakrefs(py->load_pyobj())) return false;
  } else if (strong != 1) {
    return false;
  }
  return s.getWeakStorageImpl().weak_use_count() == 2;   // this temporary one and the strong references' one
}

// Buffers of kHugeBytes or more start on a 2 MiB boundary inside a storage padded for it
// (huge_storage_bytes), and every 2 MiB page they touch is advised and collapsed into a huge
// page (advise_hugepages), where transparent huge pages are available: no page of theirs left
// on 4 KiB pages at either end (c10 aligns its allocations to 64 bytes, so each large tensor's
// first and last partial 2 MiB stayed on 4 KiB pages, 11-30% of these buffers in
// tools/bench_interaction.py, and heap pages reused keep the size they were first faulted
// with). AMD EPYC 25/17/1 (Zen 4), a C++ harness over csrc/kernels, B 2048, n 27, one thread,
// from DRAM, 2026-12-04: the backward 16-18% slower with its pooled gradient on 4 KiB pages
// (D 64 and 128), the forward 2% with its output on them.
constexpr size_t kHugeBytes = size_t(2) << 20;
size_t huge_pages_bytes(size_t n) { return (n + kHugeBytes - 1) / kHugeBytes * kHugeBytes; }   // n up to whole 2 MiB
size_t huge_storage_bytes(size_t nbytes) { return huge_pages_bytes(nbytes) + kHugeBytes; }   // room to align
bool huge_buffer(size_t nbytes) { return nbytes >= kHugeBytes && transparent_hugepages_available(); }
size_t storage_bytes(size_t nbytes) { return huge_buffer(nbytes) ? huge_storage_bytes(nbytes) : nbytes; }

// Floats from storage s's start to its first 2 MiB boundary (0 for a buffer of plain size).
int64_t buffer_offset(const c10::Storage& s, size_t nbytes) {
  if (!huge_buffer(nbytes)) return 0;
  const auto p = reinterpret_cast<uintptr_t>(s.data());
  return static_cast<int64_t>((huge_pages_bytes(p) - p) / sizeof(float));
}

// A new storage for nbytes of floats and the (contiguous) tensor on it.
at::Tensor new_buffer(at::IntArrayRef sizes, size_t nbytes, const at::TensorOptions& options) {
  if (!huge_buffer(nbytes)) return at::empty(sizes, options);
  const size_t total = huge_storage_bytes(nbytes);
  const c10::Storage s = at::empty({static_cast<int64_t>(total / sizeof(float))}, options).storage();
  const int64_t offset = buffer_offset(s, nbytes);
  const int64_t pages = static_cast<int64_t>(huge_pages_bytes(nbytes) / sizeof(float));
  advise_hugepages(at::empty({0}, options).set_(s, offset, {pages}));   // every 2 MiB page the buffer touches
  return at::empty({0}, options).set_(s, offset, sizes);
}

}  // namespace

at::Tensor reused_or_empty(Slots& slots, at::IntArrayRef sizes, const at::TensorOptions& options) {
  TORCH_CHECK(options.dtype() == at::kFloat && !slots.s.empty(), "neo._C: reused_or_empty: fp32 buffers and slots");
  int64_t numel = 1;
  for (int64_t n : sizes) numel *= n;
  const size_t nbytes = static_cast<size_t>(numel) * sizeof(float);
  for (c10::Storage& s : slots.s)
    if (s && s.nbytes() == storage_bytes(nbytes) && held_by_slot_alone(s))
      return at::empty({0}, options).set_(s, buffer_offset(s, nbytes), sizes);   // contiguous
  at::Tensor t = new_buffer(sizes, nbytes, options);
  // an empty slot, then one nobody else holds, else the last: shapes called in turn keep a slot
  // each, where the first slot taken every time gave each call a fresh buffer
  // (tests/models/test_interaction_buffers.py)
  c10::Storage* free_slot = nullptr;
  for (c10::Storage& s : slots.s)
    if (!s) { free_slot = &s; break; }
  for (size_t k = 0; k < slots.s.size() && free_slot == nullptr; ++k)
    if (held_by_slot_alone(slots.s[k])) free_slot = &slots.s[k];
  *(free_slot ? free_slot : &slots.s.back()) = t.storage();
  return t;
}

}  // namespace neo
