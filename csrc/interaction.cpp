// DLRM's dot interaction, fused (the math and its register blocking per ISA:
// csrc/kernels/interaction.h): checks and the pooled layout here, then the active
// variant's kernel; output buffers reused across calls (reused_or_empty); and the op with
// its backward as one C++ autograd node, torch.ops.neo.dot_interaction, which
// neo.models.DotInteraction calls without the dispatcher (dot_interaction_eager).
//
// Pooled layout: either a contiguous (B, F * D) tensor, or any flat buffer in which feature
// k of sample b starts at offsets[k] + b * strides[k] (e.g. the source-major output of the
// pooled AlltoAll, read in place: no assembling copy). Gradients go back in the same layout,
// multiplied by grad_scale (the sharded collection's 1 / W), into a buffer like `pooled`.
#include "interaction.h"

#include <Python.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

#include "cpu_isa.h"
#include "hugepages.h"

namespace neo {
namespace {

// Where feature k of sample b starts in the pooled buffer: off[k] + b * stride[k].
struct Layout {
  std::vector<int64_t> off, stride;
};

// Validates the inputs and returns the pooled layout.
Layout layout_of(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                 const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  TORCH_CHECK(dense.device().is_cpu() && dense.scalar_type() == at::kFloat && dense.is_contiguous() && dense.dim() == 2,
              "neo._C: dot interaction: dense must be a contiguous (B, D) fp32 CPU tensor");
  TORCH_CHECK(F >= 1 && F + 1 <= 256, "neo._C: dot interaction supports 1 to 255 features, got ", F);
  TORCH_CHECK(pooled.device().is_cpu() && pooled.scalar_type() == at::kFloat && pooled.is_contiguous(),
              "neo._C: dot interaction: pooled must be a contiguous fp32 CPU tensor");
  const int64_t B = dense.size(0), D = dense.size(1);
  Layout L;
  L.off.resize(F);
  L.stride.resize(F);
  if (!offsets.has_value()) {
    TORCH_CHECK(!strides.has_value(), "neo._C: dot interaction: feature strides given without offsets");
    TORCH_CHECK(pooled.dim() == 2 && pooled.size(0) == B && pooled.size(1) == F * D,
                "neo._C: dot interaction: pooled must be (B, F * D) = (", B, ", ", F * D, "), got ", pooled.sizes());
    for (int64_t k = 0; k < F; ++k) { L.off[k] = k * D; L.stride[k] = F * D; }
    return L;
  }
  TORCH_CHECK(strides.has_value(), "neo._C: dot interaction: feature offsets given without strides");
  TORCH_CHECK(pooled.numel() == B * F * D, "neo._C: dot interaction: the ", B, " x ", F, " vectors of ", D,
              " floats must tile the pooled buffer, which has ", pooled.numel(), " elements");
  for (const at::Tensor* t : {&*offsets, &*strides})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == F,
                "neo._C: dot interaction: feature offsets and strides must be (F,) = (", F, ",) int64 CPU tensors");
  const int64_t* o = offsets->data_ptr<int64_t>();
  const int64_t* st = strides->data_ptr<int64_t>();
  for (int64_t k = 0; k < F; ++k) {
    TORCH_CHECK(o[k] >= 0 && st[k] >= 0 && o[k] + (B > 0 ? (B - 1) * st[k] : 0) + D <= pooled.numel(),
                "neo._C: dot interaction: feature ", k, " (offset ", o[k], ", stride ", st[k],
                ") reaches past the pooled buffer of ", pooled.numel(), " elements");
    L.off[k] = o[k];
    L.stride[k] = st[k];
  }
  return L;
}

// Output buffers reused from one call to the next on a thread, when nothing holds them any
// more (the caller dropped the gradients, or the activation, since). A fresh 4 to 27 MB
// buffer per call lands on new heap pages whenever the allocator's free chunks shift
// between calls (they do when other tensors of other sizes come and go in between, as in
// tools/bench_interaction.py), and each first touch of a 4 KiB page is a page fault:
// backward at B 2048, D 128 then takes 8 to 23 ms instead of 5, faulting in 4 to 27 MB.
// A slot keeps the storage, not a tensor: the returned tensor is the only one, so autograd
// still takes it as .grad without copying (AccumulateGrad steals a gradient only when
// nothing else holds the tensor). A storage is reused only when its slot alone holds it
// (held_by_slot_alone) and it has the size wanted. Two slots per output: the previous
// call's output is often still held when the next call starts (an activation until the
// step's backward, a loop variable until reassigned). A new storage takes an empty slot
// first, then one nobody else holds (its storage, of another size, freed), else slot 1: two
// shapes called in turn (two modules, or training and evaluation batches) keep a slot each,
// where a unique slot 0 taken first gave each call a fresh buffer (tests/models/test_interaction_buffers.py).
struct Slots {
  c10::Storage s[2];
};

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
// stayed in its slot for good, never handed out again: with both slots so pinned, every
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

at::Tensor reused_or_empty(Slots& slots, at::IntArrayRef sizes, const at::TensorOptions& options) {
  int64_t numel = 1;
  for (int64_t n : sizes) numel *= n;
  const size_t nbytes = static_cast<size_t>(numel) * sizeof(float);
  for (c10::Storage& s : slots.s)
    if (s && s.nbytes() == storage_bytes(nbytes) && held_by_slot_alone(s))
      return at::empty({0}, options).set_(s, buffer_offset(s, nbytes), sizes);   // contiguous
  at::Tensor t = new_buffer(sizes, nbytes, options);
  c10::Storage& free_slot = !slots.s[0] ? slots.s[0]   // an empty slot, then one nobody else holds, else slot 1
                            : !slots.s[1] || !held_by_slot_alone(slots.s[0]) ? slots.s[1] : slots.s[0];
  free_slot = t.storage();
  return t;
}

InteractionArgs args_of(const at::Tensor& dense, const at::Tensor& pooled, int64_t F, const Layout& L) {
  InteractionArgs a;
  a.B = dense.size(0);
  a.D = dense.size(1);
  a.F = F;
  a.dense = dense.data_ptr<float>();
  a.pooled = pooled.data_ptr<float>();
  a.off = L.off.data();
  a.stride = L.stride.data();
  a.tiles = interaction_tiles_at(a.D);
  a.l1_next = interaction_l1_next();
  return a;
}

using ForwardKernel = void (*)(const InteractionArgs&, float* out);
using BackwardKernel = void (*)(const InteractionArgs&, const float* grad_out, float* grad_dense, float* grad_pooled,
                                float scale);

at::Tensor run_forward(ForwardKernel kernel, const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                       const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  thread_local Slots slots;
  at::Tensor out = reused_or_empty(slots, {B, D + P}, dense.options());
  kernel(args_of(dense, pooled, F, L), out.data_ptr<float>());
  return out;
}

std::tuple<at::Tensor, at::Tensor> run_backward(BackwardKernel kernel, const at::Tensor& grad_out,
                                                const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                                const std::optional<at::Tensor>& offsets,
                                                const std::optional<at::Tensor>& strides, double grad_scale) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  TORCH_CHECK(grad_out.device().is_cpu() && grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == B && grad_out.size(1) == D + P,
              "neo._C: dot interaction: grad_out must be a contiguous (B, D + P) fp32 CPU tensor");
  thread_local Slots dense_slots, pooled_slots;
  at::Tensor gd = reused_or_empty(dense_slots, {B, D}, dense.options());
  at::Tensor gp = reused_or_empty(pooled_slots, pooled.sizes(), pooled.options());   // like pooled (contiguous);
                                                                                    // every element is written
                                                                                    // (layout_of: the vectors tile it)
  kernel(args_of(dense, pooled, F, L), grad_out.data_ptr<float>(), gd.data_ptr<float>(), gp.data_ptr<float>(),
         static_cast<float>(grad_scale));
  return {gd, gp};
}

// The flat index in the pooled buffer of each float of the B x F pooled vectors: (B * F * D,),
// sample-major (the order of a (B, F * D) tensor).
at::Tensor pooled_index(const Layout& L, int64_t B, int64_t D) {
  const int64_t F = static_cast<int64_t>(L.off.size());
  const at::Tensor off = at::tensor(L.off, at::kLong).view({1, F, 1});
  const at::Tensor stride = at::tensor(L.stride, at::kLong).view({1, F, 1});
  const at::Tensor b = at::arange(B, at::kLong).view({B, 1, 1}), d = at::arange(D, at::kLong).view({1, 1, D});
  return (b * stride + off + d).reshape(-1);
}

// The backward's formula in differentiable ATen ops (the torch path's, neo/models/interaction.py),
// on the same pooled layout and grad_scale as the kernel: v = [dense, pooled vectors] (B, n, D),
// S the pair gradients symmetrised (B, n, n), grad v = S v. For a backward that is itself
// differentiated; about the torch path's speed.
std::tuple<at::Tensor, at::Tensor> backward_as_ops(const at::Tensor& grad_out, const at::Tensor& dense,
                                                   const at::Tensor& pooled, int64_t F,
                                                   const std::optional<at::Tensor>& offsets,
                                                   const std::optional<at::Tensor>& strides, double grad_scale) {
  const Layout L = layout_of(dense, pooled, F, offsets, strides);
  const int64_t B = dense.size(0), D = dense.size(1), n = F + 1, P = n * (n - 1) / 2;
  TORCH_CHECK(grad_out.dim() == 2 && grad_out.size(0) == B && grad_out.size(1) == D + P,
              "neo._C: dot interaction: grad_out must be (B, D + P) = (", B, ", ", D + P, "), got ", grad_out.sizes());
  const at::Tensor idx = pooled_index(L, B, D);
  const at::Tensor v = at::cat({dense.unsqueeze(1), pooled.reshape(-1).index_select(0, idx).view({B, F, D})}, 1);
  std::vector<int64_t> pairs;                                          // (i, j), i < j, as i * n + j
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) pairs.push_back(i * n + j);
  const at::Tensor S = at::zeros({B, n * n}, grad_out.options())
                           .index_copy(1, at::tensor(pairs, at::kLong), grad_out.narrow(1, D, P))
                           .view({B, n, n});
  const at::Tensor dv = at::bmm(S + S.transpose(1, 2), v);           // (B, n, D)
  const at::Tensor gd = grad_out.narrow(1, 0, D) + dv.select(1, 0);
  const at::Tensor gp = at::zeros({pooled.numel()}, pooled.options())
                            .index_copy(0, idx, dv.narrow(1, 1, F).reshape(-1) * grad_scale)
                            .view(pooled.sizes());
  return {gd, gp};
}

}  // namespace

at::Tensor dot_interaction_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                  const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides) {
  return run_forward(kernels().interaction_forward, dense, pooled, F, offsets, strides);
}

std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(
    const at::Tensor& grad_out, const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
    const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides, double grad_scale) {
  return run_backward(kernels().interaction_backward, grad_out, dense, pooled, F, offsets, strides, grad_scale);
}

at::Tensor interaction_traffic_forward(const at::Tensor& dense, const at::Tensor& pooled, int64_t F) {
  return run_forward(kernels().interaction_traffic_forward, dense, pooled, F, std::nullopt, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> interaction_traffic_backward(const at::Tensor& grad_out, const at::Tensor& dense,
                                                                const at::Tensor& pooled, int64_t F) {
  return run_backward(kernels().interaction_traffic_backward, grad_out, dense, pooled, F, std::nullopt,
                      std::nullopt, 1.0);
}

namespace {

// Forward and backward as one autograd node in C++: no Python autograd.Function around the
// kernels. At B 2048 each step runs with cold caches (the batch streams through), and the
// Python path's own code and objects cost about 0.15 ms a direction then (the kernels:
// 1.5 + 2 ms at D 64). The name says "Fused": tests find it in grad_fn.
class FusedDotInteraction : public torch::autograd::Function<FusedDotInteraction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& dense, const at::Tensor& pooled,
                            int64_t F, const std::optional<at::Tensor>& offsets,
                            const std::optional<at::Tensor>& strides, double grad_scale) {
    ctx->save_for_backward({dense, pooled});   // contiguous (fused_apply): the inputs themselves
    ctx->saved_data["F"] = F;
    ctx->saved_data["offsets"] = offsets;
    ctx->saved_data["strides"] = strides;
    ctx->saved_data["grad_scale"] = grad_scale;
    return dot_interaction_forward(dense, pooled, F, offsets, strides);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const int64_t F = ctx->saved_data["F"].toInt();
    const auto offsets = ctx->saved_data["offsets"].toOptional<at::Tensor>();
    const auto strides = ctx->saved_data["strides"].toOptional<at::Tensor>();
    const double grad_scale = ctx->saved_data["grad_scale"].toDouble();
    // create_graph=True (a gradient penalty, Hessian-vector products): gradients that carry a
    // graph. The kernel's carry none, and autograd would take them as constants: second-order
    // terms through the interaction silently dropped, or "does not require grad" raised.
    auto [gd, gp] = at::GradMode::is_enabled()
                        ? backward_as_ops(grads[0], saved[0], saved[1], F, offsets, strides, grad_scale)
                        : dot_interaction_backward(grads[0].contiguous(), saved[0], saved[1], F, offsets, strides,
                                                   grad_scale);
    return {gd, gp, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The node on contiguous inputs: a non-contiguous one is copied by a differentiable op
// first, so that the tensors saved for backward are the node's inputs, whose graph a
// differentiated backward (backward_as_ops) needs.
at::Tensor fused_apply(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                       const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides,
                       double grad_scale) {
  return FusedDotInteraction::apply(dense.contiguous(), pooled.contiguous(), F, offsets, strides, grad_scale);
}

at::Tensor dot_interaction(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                           const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& strides,
                           double grad_scale) {
  return fused_apply(dense, pooled, F, offsets, strides, grad_scale);
}

}  // namespace

std::optional<at::Tensor> dot_interaction_eager(const at::Tensor& dense, const at::Tensor& pooled, int64_t F,
                                                const std::optional<at::Tensor>& offsets,
                                                const std::optional<at::Tensor>& strides, double grad_scale) {
  if (!dense.device().is_cpu() || !pooled.device().is_cpu() || dense.scalar_type() != at::kFloat ||
      pooled.scalar_type() != at::kFloat || at::autocast::is_autocast_enabled(at::kCPU))
    return std::nullopt;
  return fused_apply(dense, pooled, F, offsets, strides, grad_scale);
}

}  // namespace neo

// torch.ops.neo.dot_interaction (after `import neo._C`): the fused op with its backward, the
// pooled layout and grad_scale as in dot_interaction_forward / _backward.
TORCH_LIBRARY_FRAGMENT(neo, m) {
  m.def("dot_interaction(Tensor dense, Tensor pooled, int num_features, Tensor? feature_offsets=None, "
        "Tensor? feature_strides=None, float grad_scale=1.0) -> Tensor");
}
TORCH_LIBRARY_IMPL(neo, CompositeImplicitAutograd, m) { m.impl("dot_interaction", &neo::dot_interaction); }
