"""CPU backend: the C++ kernels of ``csrc/`` (``neo._C``), multithreaded with at::parallel_for.

- ``forward``: pooled lookup of all features of a group in one call (fp32 accumulation,
  fp32/fp16/bf16 weights, sum/mean pooling, optional per-id weights).
- ``backward_update``: fused backward + sparse optimizer: ids are grouped by global row
  with a stable parallel radix sort, each touched row's gradient is summed in fp32 and the
  optimizer applied to it in place. No dense gradient.

ISA: the kernels are built once per instruction set (``baseline``, ``avx2``, ``avx512`` on
x86-64) and ``neo._C`` runs the best one this CPU supports; ``NEO_CPU_ISA`` overrides it
(``neo.cpp``). ``CpuBackend.isa`` says which runs; the first backend of a process logs it
(logger ``neo``, INFO).

Ids outside ``[0, rows)`` contribute zero and are not updated; the number skipped by the
last call is kept in ``last_invalid_count`` (cheap: counted by the kernels).
Threads: ``torch.set_num_threads``. Results depend neither on the number of threads nor on the
ISA variant (the same IEEE operations in the same order; tested bit for bit).

Huge pages: random rows of multi-gigabyte tables make nearly every lookup a TLB miss. The
first time the backend sees a weight or state buffer of at least 64 MiB it asks the kernel
to back it by 2 MiB transparent huge pages (``madvise`` MADV_HUGEPAGE + MADV_COLLAPSE, a
one-off cost of about 2.5 s per GB); on the 2-core benchmark machine this cut the time of
the fused backward by about a third. Set ``NEO_HUGEPAGES=0`` to skip it.
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional

import torch

from neo.config.embedding import OptimizerType
from neo.embedding.layout import GroupLayout

try:
    from neo import _C
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        f"the 'cpu' embedding backend needs the C++ extension neo._C, which is not built or failed to load ({e}); "
        "run bash tools/setup.sh (or pip install --no-build-isolation --no-deps -e . from the repository root)"
    ) from e

_OPT_KIND = {
    OptimizerType.SGD: 0,
    OptimizerType.ADAGRAD: 1,
    OptimizerType.ROWWISE_ADAGRAD: 2,
    OptimizerType.ADAM: 3,
    OptimizerType.LAMB: 4,
}


def _ids(indices: torch.Tensor) -> torch.Tensor:
    return indices if indices.dtype == torch.int64 and indices.is_contiguous() else indices.to(torch.int64).contiguous()


def _psw(w: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if w is None:
        return None
    return w if w.dtype == torch.float32 and w.is_contiguous() else w.to(torch.float32).contiguous()


_HUGEPAGE_MIN_BYTES = 64 << 20
_logged_isa = False


def _log_isa_once() -> None:
    global _logged_isa
    if not _logged_isa:
        _logged_isa = True
        from neo.cpp import cpu_isa_info, describe_cpu_kernels

        logging.getLogger("neo").info("cpu backend kernels: %s", describe_cpu_kernels(cpu_isa_info()))


class CpuBackend:
    name = "cpu"
    counts_invalid_ids = True   # forward sets last_invalid_count: the module's id check rides on it

    def __init__(self) -> None:
        self.last_invalid_count = 0
        self._advised: set = set()
        self._hugepages = os.environ.get("NEO_HUGEPAGES", "1") != "0"
        _log_isa_once()

    @property
    def isa(self) -> str:
        """The ISA variant of the kernels that run: ``baseline``, ``avx2`` or ``avx512``."""
        return _C.cpu_isa()

    def _advise_hugepages(self, buffers) -> None:
        if not self._hugepages:
            return
        for t in buffers:
            key = (t.data_ptr(), t.numel())
            if key not in self._advised:
                self._advised.add(key)
                if t.numel() * t.element_size() >= _HUGEPAGE_MIN_BYTES:
                    _C.advise_hugepages(t)

    def forward(self, layout: GroupLayout, weights: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: Optional[torch.Tensor], batch_size: int) -> torch.Tensor:
        self._advise_hugepages((weights,))
        out, invalid = _C.embedding_forward(
            weights, _ids(indices), _ids(offsets), _psw(per_sample_weights), *layout.kernel_tensors(), batch_size
        )
        self.last_invalid_count = invalid
        return out

    def per_sample_weights_grad(self, layout: GroupLayout, weights: torch.Tensor, grad_output: torch.Tensor,
                                indices: torch.Tensor, offsets: torch.Tensor, batch_size: int) -> torch.Tensor:
        """(N,) fp32: what :func:`~neo.embedding.backends.reference.per_sample_weights_grad`
        computes, in one C++ pass (csrc/kernels/weight_grad.h)."""
        grad = grad_output if grad_output.dtype == torch.float32 and grad_output.is_contiguous() \
            else grad_output.to(torch.float32).contiguous()
        return _C.embedding_weight_grad(weights, _ids(indices), _ids(offsets), grad, *layout.kernel_tensors(),
                                        batch_size)

    def backward_update(self, layout: GroupLayout, weights: torch.Tensor, states: List[torch.Tensor],
                        grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                        per_sample_weights: Optional[torch.Tensor], batch_size: int, lr: float, step: int,
                        seed: int) -> None:
        self._advise_hugepages([weights, *states])
        opt = layout.optimizer
        grad = grad_output if grad_output.dtype == torch.float32 and grad_output.is_contiguous() \
            else grad_output.to(torch.float32).contiguous()
        self.last_invalid_count = _C.embedding_backward_update(
            weights, list(states), grad, _ids(indices), _ids(offsets), _psw(per_sample_weights),
            *layout.kernel_tensors(), batch_size, _OPT_KIND[opt.type], float(lr), float(opt.eps),
            float(opt.weight_decay), float(opt.beta1), float(opt.beta2), int(step), int(seed),
            bool(layout.stochastic_rounding),
        )
