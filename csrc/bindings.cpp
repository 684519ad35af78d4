// Python bindings of neo._C (the CPU embedding kernels). The GIL is released while a kernel
// runs (the kernels use at::parallel_for, which respects torch.set_num_threads). Every hot
// kernel is built once per ISA and chosen at import (cpu_isa.h); the cpu_isa* functions say
// which, and _set_cpu_isa switches (tests, benchmarks).
#include <torch/extension.h>
#include <pybind11/stl.h>

#include "bucketize.h"
#include "cpu_isa.h"
#include "embedding_kernels.h"
#include "interaction.h"

namespace neo { bool advise_hugepages(const at::Tensor& t); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  neo::init_cpu_isa();   // NEO_CPU_ISA, else the best variant this CPU runs (a bad NEO_CPU_ISA fails the import)
  m.doc() = "Neo CPU kernels: pooled embedding forward, fused backward + sparse optimizer, DLRM dot interaction, row bucketization";
  m.def("embedding_forward", &neo::embedding_forward, py::call_guard<py::gil_scoped_release>(),
        "Pooled lookup of a group; returns (out (B, total_dim) fp32, invalid id count)",
        py::arg("weights"), py::arg("indices"), py::arg("offsets"), py::arg("per_sample_weights"),
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
  m.def("bucketize_rows", &neo::bucketize_rows, py::call_guard<py::gil_scoped_release>(),
        "Row-range bucketization of one feature's ids: (lengths (S, B), re-based ids by shard, sizes (S,), positions)",
        py::arg("values"), py::arg("bag_offsets"), py::arg("bounds"), py::arg("with_positions") = false);
  m.def("advise_hugepages", &neo::advise_hugepages, py::call_guard<py::gil_scoped_release>(),
        "Back a large CPU buffer by transparent huge pages (best effort); True if collapsed now");
  m.def("cpu_isa", &neo::cpu_isa, "The ISA variant of the kernels in use: 'baseline', 'avx2' or 'avx512'");
  m.def("cpu_isa_variants", &neo::cpu_isa_variants, "The ISA variants built into this library, lowest first");
  m.def("cpu_isa_supported", &neo::cpu_isa_supported, "The built ISA variants this CPU can run, lowest first");
  m.def("cpu_features", &neo::cpu_features, "CPU features the choice rests on, as (name, present) pairs (x86: cpuid, xgetbv)");
  m.def("_set_cpu_isa", &neo::set_cpu_isa, py::arg("name"),
        "Tests and benchmarks: use the kernels of variant `name` ('auto' = the best); RuntimeError if not runnable here");
  m.def("gather_probe", &neo::gather_probe, py::call_guard<py::gil_scoped_release>(),
        "Diagnostics: sum rows `ids` of row_bytes bytes of a flat buffer (the machine's gather speed); returns a checksum",
        py::arg("table"), py::arg("row_bytes"), py::arg("ids"), py::arg("near"), py::arg("far"));
  m.def("_set_tuning", [](int64_t fwd_prefetch, int64_t bwd_lookahead) {
        neo::tuning() = neo::Tuning{fwd_prefetch, bwd_lookahead};
      }, "Benchmarking only: prefetch distances of the kernels (ids / sorted items ahead)");
}
