// Python bindings of neo._C (the CPU embedding kernels). The GIL is released while a kernel
// runs (the kernels use at::parallel_for, which respects torch.set_num_threads). Every hot
// kernel is built once per ISA and chosen at import (cpu_isa.h); the cpu_isa* functions say
// which, and _set_cpu_isa switches (tests, benchmarks).
#include <torch/extension.h>
#include <pybind11/stl.h>

#include "bias_relu.h"
#include "bucketize.h"
#include "cache_index.h"
#include "cache_moves.h"
#include "column_runs.h"
#include "cpu_isa.h"
#include "embedding_kernels.h"
#include "hugepages.h"
#include "id_check.h"
#include "interaction.h"
#include "jagged_take.h"
#include "position_weights.h"
#include "unique_rows.h"


namespace {

// A contiguous 1-D int64 array (numpy, any buffer), else std::invalid_argument "op: what must be ...".
py::buffer_info int64_vector(const py::buffer& b, const std::string& op, const std::string& what) {
  py::buffer_info i = b.request();
  if (i.ndim != 1 || i.itemsize != 8 || (i.format != "l" && i.format != "q") || (i.shape[0] > 1 && i.strides[0] != 8))
    throw std::invalid_argument(op + ": " + what + " must be a contiguous 1-D int64 array");
  return i;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // torch's Python side first (its tensor types for the bindings' arguments): `import neo._C`
  // works on its own, torch's libraries found through the run path (setup.py).
  py::module_::import("torch");
  neo::init_cpu_isa();   // NEO_CPU_ISA, else the best variant this CPU runs (a bad NEO_CPU_ISA fails the import)
  m.doc() = "Neo CPU kernels: pooled embedding forward, fused backward + sparse optimizer, DLRM dot interaction, row bucketization";
  m.def("embedding_forward", &neo::embedding_forward, py::call_guard<py::gil_scoped_release>(),
        "Pooled lookup of a group; returns (out (B, total_dim) fp32, invalid id count)",
        py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights"),
        py::arg("table_rows"), py::arg("table_dims"), py::arg("weight_offsets"), py::arg("row_offsets"),
        py::arg("feature_table"), py::arg("output_offsets"), py::arg("feature_mean"), py::arg("batch_size"));
  m.def("embedding_weight_grad", &neo::embedding_weight_grad, py::call_guard<py::gil_scoped_release>(),
        "Gradient of a group's pooled lookup with respect to its per-id weights: (N,) fp32",
        py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("grad_output"),
        py::arg("table_rows"), py::arg("table_dims"), py::arg("weight_offsets"), py::arg("row_offsets"),
        py::arg("feature_table"), py::arg("output_offsets"), py::arg("feature_mean"), py::arg("batch_size"));
  m.def("embedding_backward_update", &neo::embedding_backward_update, py::call_guard<py::gil_scoped_release>(),
        "Fused backward + sparse optimizer step, in place; returns the invalid id count",
        py::arg("weights"), py::arg("states"), py::arg("grad_output"), py::arg("indices"), py::arg("offsets"),
        py::arg("per_sample_weights"), py::arg("table_rows"), py::arg("table_dims"), py::arg("weight_offsets"),
        py::arg("row_offsets"), py::arg("feature_table"), py::arg("output_offsets"), py::arg("feature_mean"),
        py::arg("batch_size"), py::arg("opt_kind"), py::arg("lr"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("beta1"), py::arg("beta2"), py::arg("step"), py::arg("seed"), py::arg("stochastic_rounding"));
  m.def("dot_interaction_forward", &neo::dot_interaction_forward, py::call_guard<py::gil_scoped_release>(),
        "DLRM dot interaction: [dense, pairwise dots of (dense, pooled_1..F)] (B, D + F(F+1)/2)",
        py::arg("dense"), py::arg("pooled"), py::arg("num_features"), py::arg("feature_offsets") = py::none(),
        py::arg("feature_strides") = py::none());
  m.def("dot_interaction_backward", &neo::dot_interaction_backward, py::call_guard<py::gil_scoped_release>(),
        "Backward of dot_interaction_forward: (grad_dense (B, D), grad_pooled like pooled, times grad_scale)",
        py::arg("grad_out"), py::arg("dense"), py::arg("pooled"), py::arg("num_features"),
        py::arg("feature_offsets") = py::none(), py::arg("feature_strides") = py::none(), py::arg("grad_scale") = 1.0);
  m.def("dot_interaction_eager", &neo::dot_interaction_eager, py::call_guard<py::gil_scoped_release>(),
        "torch.ops.neo.dot_interaction without the dispatcher (an autograd node), or None where the fused kernel "
        "does not apply (not CPU fp32, or CPU autocast on)",
        py::arg("dense"), py::arg("pooled"), py::arg("num_features"), py::arg("feature_offsets") = py::none(),
        py::arg("feature_strides") = py::none(), py::arg("grad_scale") = 1.0);
  m.def("position_slots", &neo::position_slots, py::call_guard<py::gil_scoped_release>(),
        "Each id's slot in a PositionWeights table: (slots (n,) int64, the first bag longer than its "
        "feature's limit or -1)",
        py::arg("offsets"), py::arg("first"), py::arg("limits"), py::arg("ones"), py::arg("batch_size"), py::arg("n"));
  m.def("position_read", &neo::position_read, py::call_guard<py::gil_scoped_release>(),
        "(N,) fp32: a PositionWeights table (parts end to end, then 1) at slots", py::arg("parts"), py::arg("slots"));
  m.def("position_read_backward", &neo::position_read_backward, py::call_guard<py::gil_scoped_release>(),
        "The parts' gradients of position_read: grad summed at slots, in id order",
        py::arg("grad"), py::arg("slots"), py::arg("sizes"));
  m.def("bias_relu_", &neo::bias_relu_, py::call_guard<py::gil_scoped_release>(),
        "An MLP layer's bias and ReLU in place: y (B, N) = relu(y + bias); returns y", py::arg("y"), py::arg("bias"));
  m.def("relu_bias_backward", &neo::relu_bias_backward, py::call_guard<py::gil_scoped_release>(),
        "Backward of bias_relu_ given its output y: (grad masked by y > 0, its column sums (the bias gradient))",
        py::arg("grad"), py::arg("y"));
  m.def("jagged_take", [](const std::vector<py::buffer>& ids, const std::vector<py::buffer>& offsets,
                          const py::buffer& part, const py::buffer& row) {
        // the buffer protocol, no numpy C API; ids may be read-only (Arrow's buffers): never written
        if (ids.empty() || ids.size() != offsets.size())
          throw std::invalid_argument("jagged_take: " + std::to_string(ids.size()) + " id blocks but " +
                                      std::to_string(offsets.size()) + " offset blocks");
        std::vector<py::buffer_info> keep;
        std::vector<neo::JaggedBlock> blocks;
        int64_t elem = 0;
        std::string fmt;
        for (size_t p = 0; p < ids.size(); ++p) {
          py::buffer_info v = ids[p].request();
          const bool ok = v.ndim == 1 && (v.itemsize == 4 || v.itemsize == 8) &&
                          (v.format == "i" || v.format == "l" || v.format == "q") &&
                          (v.shape[0] <= 1 || v.strides[0] == v.itemsize);
          if (!ok || (p > 0 && (v.itemsize != elem || v.format != fmt)))
            throw std::invalid_argument("jagged_take: block " + std::to_string(p) +
                                        ": ids must be contiguous 1-D int32 or int64 arrays of one dtype");
          elem = v.itemsize;
          fmt = v.format;
          py::buffer_info o = int64_vector(offsets[p], "jagged_take", "block " + std::to_string(p) + "'s offsets");
          if (o.shape[0] < 1) throw std::invalid_argument("jagged_take: block " + std::to_string(p) + ": no offsets");
          blocks.push_back({static_cast<const char*>(v.ptr), static_cast<int64_t>(v.shape[0]),
                            static_cast<const int64_t*>(o.ptr), static_cast<int64_t>(o.shape[0]) - 1});
          keep.push_back(std::move(v));
          keep.push_back(std::move(o));
        }
        py::buffer_info pi = int64_vector(part, "jagged_take", "part"), ri = int64_vector(row, "jagged_take", "row");
        if (pi.shape[0] != ri.shape[0]) throw std::invalid_argument("jagged_take: part and row differ in length");
        const int64_t m = pi.shape[0];
        const auto* pp = static_cast<const int64_t*>(pi.ptr);
        const auto* rp = static_cast<const int64_t*>(ri.ptr);
        at::Tensor out_off = at::empty({m + 1}, at::kLong);
        neo::jagged_take_offsets(blocks, pp, rp, m, out_off.data_ptr<int64_t>());
        at::Tensor out = at::empty({out_off.data_ptr<int64_t>()[m]}, elem == 4 ? at::kInt : at::kLong);
        {
          py::gil_scoped_release nogil;
          neo::jagged_take_copy(blocks, pp, rp, m, out_off.data_ptr<int64_t>(), elem,
                                static_cast<char*>(out.data_ptr()));
        }
        return std::make_tuple(out, out_off);
      },
      "Rows (part[i], row[i]) of jagged blocks (ids, offsets; any buffers) laid end to end: "
      "(ids, offsets from 0) as tensors",
      py::arg("ids"), py::arg("offsets"), py::arg("part"), py::arg("row"));
  m.def("fixed_take", [](const std::vector<py::buffer>& blocks, const py::buffer& part, const py::buffer& row,
                         const py::buffer& out) {
        // rows of equal byte width, each block and `out` C-contiguous (checked here); any dtype
        auto rows_of = [](const py::buffer_info& i, const std::string& what) {
          int64_t width = i.itemsize;
          for (py::ssize_t d = i.ndim - 1; d >= 1; --d) {
            if (i.shape[d] > 1 && i.strides[d] != width)
              throw std::invalid_argument("fixed_take: " + what + " must be C-contiguous");
            width *= i.shape[d];
          }
          if (i.ndim < 1 || (i.shape[0] > 1 && i.strides[0] != width))
            throw std::invalid_argument("fixed_take: " + what + " must be a C-contiguous array of rows");
          return width;   // bytes a row
        };
        if (blocks.empty()) throw std::invalid_argument("fixed_take: no blocks");
        py::buffer_info o = out.request(true);
        const int64_t row_bytes = rows_of(o, "out");
        std::vector<py::buffer_info> keep;
        std::vector<neo::FixedBlock> fb;
        for (size_t p = 0; p < blocks.size(); ++p) {
          py::buffer_info b = blocks[p].request();
          const std::string what = "block " + std::to_string(p);
          if (b.format != o.format || b.itemsize != o.itemsize || rows_of(b, what) != row_bytes)
            throw std::invalid_argument("fixed_take: " + what + " differs from out in dtype or row width");
          fb.push_back({static_cast<const char*>(b.ptr), static_cast<int64_t>(b.shape[0])});
          keep.push_back(std::move(b));
        }
        py::buffer_info pi = int64_vector(part, "fixed_take", "part"), ri = int64_vector(row, "fixed_take", "row");
        if (pi.shape[0] != ri.shape[0] || pi.shape[0] != o.shape[0])
          throw std::invalid_argument("fixed_take: part, row and out differ in length");
        py::gil_scoped_release nogil;
        neo::fixed_take(fb, static_cast<const int64_t*>(pi.ptr), static_cast<const int64_t*>(ri.ptr), pi.shape[0],
                        row_bytes, static_cast<char*>(o.ptr));
      },
      "out[i] = row row[i] of block part[i]: blocks (any buffers, C-contiguous, of out's dtype and row width) laid "
      "end to end",
      py::arg("blocks"), py::arg("part"), py::arg("row"), py::arg("out"));
  m.def("column_runs", &neo::column_runs, py::call_guard<py::gil_scoped_release>(),
        "For every row and run (src, src_col, dst, dst_col, n, add) in order: dsts[dst][:, dst_col:+n] = "
        "scale * srcs[src][:, src_col:+n] (add 0), or += srcs[...] (add 1); fp32 matrices of equal row count",
        py::arg("srcs"), py::arg("dsts"), py::arg("runs"), py::arg("scale") = 1.0);
  m.def("bucketize_rows", &neo::bucketize_rows, py::call_guard<py::gil_scoped_release>(),
        "Row-range bucketization of one feature's ids: (lengths (S, B), re-based ids by shard, sizes (S,), positions)",
        py::arg("values"), py::arg("bag_offsets"), py::arg("bounds"), py::arg("with_positions") = false);
  m.def("check_id_ranges", &neo::check_id_ranges, py::call_guard<py::gil_scoped_release>(),
        "Per feature, the ids outside [0, rows[f]) (counts (F,) int64), and with to_int32 the ids as int32 "
        "clamped to [-1, 2^31 - 1] (else an empty tensor); starts (F + 1,): each feature's first id, then N",
        py::arg("values"), py::arg("starts"), py::arg("rows"), py::arg("to_int32") = false);
  m.def("cache_victims", &neo::cache_victims, py::call_guard<py::gil_scoped_release>(),
        "A cached table's eviction choice (neo/embedding/cache/index.py is the reference): (the `need` slots, "
        "the evictable count)", py::arg("key"), py::arg("pinned"), py::arg("need"), py::arg("row_of_slot"),
        py::arg("window_mask") = py::none(), py::arg("bit_value") = py::none());
  m.def("cache_admit", &neo::cache_admit, py::call_guard<py::gil_scoped_release>(),
        "A cached table's admission of a batch, in place on its index arrays (neo/embedding/cache/index.py is the "
        "reference): (slots, miss_rows, fill_slots, evicted_rows, evicted_slots, hits, free taken, evictable)",
        py::arg("rows"), py::arg("seq"), py::arg("slot_of_row"), py::arg("row_of_slot"), py::arg("key"),
        py::arg("count"), py::arg("free"), py::arg("pinned"), py::arg("window_mask") = py::none(),
        py::arg("bit_value") = py::none());
  m.def("cache_window_update", &neo::cache_window_update, py::call_guard<py::gil_scoped_release>(),
        "A cached table's lookahead window moves, in place on its mask: bits cleared on the rows of batches "
        "leaving it, then set on those entering it", py::arg("mask"), py::arg("clear_rows"), py::arg("clear_bits"),
        py::arg("set_rows"), py::arg("set_bits"));
  m.def("cache_swap_rows", &neo::cache_swap_rows, py::call_guard<py::gil_scoped_release>(),
        "A cached table's row moves of one admission, in place (neo/embedding/cache/table_cache.py is the "
        "reference): the dirty victims written back, the missing rows read into their slots and marked clean, "
        "then the slots `mark` marked dirty; returns the rows written back",
        py::arg("slot_bufs"), py::arg("store_bufs"), py::arg("dirty"), py::arg("evicted_slots"),
        py::arg("evicted_rows"), py::arg("fill_slots"), py::arg("fill_rows"), py::arg("mark") = py::none());
  m.def("unique_rows", &neo::unique_rows, py::call_guard<py::gil_scoped_release>(),
        "A batch's distinct rows: (the ids in [0, num_rows), distinct and ascending; each id's position among "
        "them, -1 for an id outside [0, num_rows))", py::arg("ids"), py::arg("num_rows"));
  m.def("advise_hugepages", &neo::advise_hugepages, py::call_guard<py::gil_scoped_release>(),
        "Back a large CPU buffer by transparent huge pages (best effort); True if collapsed now");
  m.def("cpu_isa", &neo::cpu_isa, "The ISA variant of the kernels in use: 'baseline', 'avx2' or 'avx512'");
  m.def("cpu_isa_variants", &neo::cpu_isa_variants, "The ISA variants built into this library, lowest first");
  m.def("cpu_isa_supported", &neo::cpu_isa_supported, "The built ISA variants this CPU can run, lowest first");
  m.def("cpu_features", &neo::cpu_features, "CPU features the choice rests on, as (name, present) pairs (x86: cpuid, xgetbv)");
  m.def("_set_cpu_isa", &neo::set_cpu_isa, py::arg("name"),
        "Tests and benchmarks: use the kernels of variant `name` ('auto' = the best); RuntimeError if not runnable here");
  m.def("interaction_tiles", &neo::interaction_tiles,
        "The dot interaction forward's tile setting: 'auto', 'narrow', 'wide' or 'grouped' (NEO_INTERACTION_TILES)");
  m.def("interaction_forward_tiles", &neo::interaction_forward_tiles, py::arg("dim"),
        "The tiles the active kernels' dot interaction forward runs at this D: 'narrow', 'wide' or 'grouped'");
  m.def("interaction_l1_next", &neo::interaction_l1_next,
        "Whether the dot interaction prefetches the next sample's rows into L1, not L2 (Zen 5 only, cpu_isa.h)");
  m.def("interaction_wide", &neo::interaction_wide, py::arg("dim"),
        "Whether the active kernels' dot interaction forward at this D runs in 16-float (wide) tiles");
  m.def("_set_interaction_tiles", &neo::set_interaction_tiles, py::arg("name"),
        "Tests and benchmarks: the interaction forward's tiles ('auto', 'narrow', 'wide', 'grouped'); "
        "RuntimeError otherwise");
  m.def("gather_probe", &neo::gather_probe, py::call_guard<py::gil_scoped_release>(),
        "Diagnostics: sum rows `ids` of row_bytes bytes of a flat buffer (the machine's gather speed), prefetching "
        "`near` ids ahead into L1 and `far` ids ahead with locality hint far_hint (1: L2, 2: prefetcht2, "
        "0: non-temporal), every far_every-th line; returns a checksum",
        py::arg("table"), py::arg("row_bytes"), py::arg("ids"), py::arg("near"), py::arg("far"),
        py::arg("far_hint") = 1, py::arg("far_every") = 1);
  m.def("chase_probe", &neo::chase_probe, py::call_guard<py::gil_scoped_release>(),
        "Diagnostics: from row `start`, `steps` dependent reads of a flat buffer whose rows of row_bytes bytes "
        "each hold the next row's index in their first 8 bytes (the memory latency); returns the row reached",
        py::arg("table"), py::arg("row_bytes"), py::arg("start"), py::arg("steps"));
  m.def("interaction_traffic_forward", &neo::interaction_traffic_forward, py::call_guard<py::gil_scoped_release>(),
        "Diagnostics: dot_interaction_forward's reads and writes alone, no arithmetic (its memory floor); "
        "an output of the same shape, of no meaning", py::arg("dense"), py::arg("pooled"), py::arg("num_features"));
  m.def("interaction_traffic_backward", &neo::interaction_traffic_backward, py::call_guard<py::gil_scoped_release>(),
        "Diagnostics: dot_interaction_backward's reads and writes alone, no arithmetic (its memory floor); "
        "gradients of the same shapes, of no meaning",
        py::arg("grad_out"), py::arg("dense"), py::arg("pooled"), py::arg("num_features"));
  m.def("_round_rows", &neo::round_rows, py::call_guard<py::gil_scoped_release>(),
        "Tests: rows of x (n, D) fp32 rounded to 'fp16'/'bf16' as the fused optimizers store updated rows "
        "(stochastically keyed by seed, step and the flat element index elem0 + i D + d)",
        py::arg("x"), py::arg("dtype"), py::arg("stochastic_rounding"), py::arg("seed"), py::arg("step"), py::arg("elem0"));
  m.def("_set_tuning", [](int64_t fwd_prefetch, int64_t bwd_lookahead, int64_t fwd_stream, int64_t sort_prefetch,
                          int64_t bwd_far, int64_t fwd_far, int64_t fwd_prefetch32, int64_t fwd_far32) {
        const neo::Tuning d = neo::default_tuning();
        const auto pick = [](int64_t v, int64_t fallback) { return v < 0 ? fallback : v; };
        // The forward's distances as fwd_prefetch alone set them before the others existed: a far
        // distance left out, its near one given, is 8 times it; an fp32 one left out follows the
        // 16-bit one where that is given.
        const int64_t near = pick(fwd_prefetch, d.fwd_prefetch);
        const int64_t far = pick(fwd_far, fwd_prefetch >= 0 ? 8 * near : d.fwd_far);
        const int64_t near32 = pick(fwd_prefetch32, fwd_prefetch >= 0 ? near : d.fwd_prefetch32);
        const int64_t far32 = pick(fwd_far32, fwd_prefetch32 >= 0 ? 8 * near32
                                                                  : fwd_prefetch >= 0 || fwd_far >= 0 ? far : d.fwd_far32);
        neo::tuning() = neo::Tuning{near, pick(bwd_lookahead, d.bwd_lookahead), pick(fwd_stream, d.fwd_stream),
                                    pick(sort_prefetch, d.sort_prefetch), pick(bwd_far, d.bwd_far), far, near32, far32};
      }, py::arg("fwd_prefetch") = -1, py::arg("bwd_lookahead") = -1, py::arg("fwd_stream") = -1,
      py::arg("sort_prefetch") = -1, py::arg("bwd_far") = -1, py::arg("fwd_far") = -1,
      py::arg("fwd_prefetch32") = -1, py::arg("fwd_far32") = -1,
      "Benchmarking only: prefetch distances of the kernels (the forward's ids ahead into L1 and L2, "
      "fwd_prefetch / fwd_far for 16-bit tables and fwd_prefetch32 / fwd_far32 for fp32 ones, far 0: none; "
      "rows ahead in the sorted backward), the forward's streaming stores and the backward sort's write "
      "prefetches. A negative value (the default) sets this CPU's default, so _set_tuning() restores them all; "
      "but a far distance left out, its near one given, is 8 times it, and an fp32 distance left out follows "
      "the 16-bit one where that is given (fwd_prefetch=16 alone: 16 and 128 ids ahead for every table)");
  m.def("_tuning", [] {
        const neo::Tuning& t = neo::tuning();
        return py::dict(py::arg("fwd_prefetch") = t.fwd_prefetch, py::arg("bwd_lookahead") = t.bwd_lookahead,
                        py::arg("fwd_stream") = t.fwd_stream, py::arg("sort_prefetch") = t.sort_prefetch,
                        py::arg("bwd_far") = t.bwd_far, py::arg("fwd_far") = t.fwd_far,
                        py::arg("fwd_prefetch32") = t.fwd_prefetch32, py::arg("fwd_far32") = t.fwd_far32);
      }, "Benchmarking only: the kernels' prefetch distances and store policy now in force (_set_tuning)");
}
