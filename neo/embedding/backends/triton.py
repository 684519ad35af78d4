"""Triton backend: one forward launch and one fused backward+optimizer launch per group.

Runs on CUDA tensors; under ``TRITON_INTERPRET=1`` (set before triton is first imported)
the same kernels run on CPU tensors, which is how the tests exercise it without a GPU.
triton is imported lazily, on first use, so ``import neo`` works where it is missing.

Forward (:func:`~neo.embedding.backends.triton_kernels.pooled_forward_kernel`): a program
per (feature, bag) gathers the bag's rows a tile of ids at a time and pools them in fp32;
asked to (``invalid_counts``), it also adds the bag's invalid ids to its feature's count, one
atomic add per bag that has any.

Backward + update, with no dense gradient (:meth:`TritonBackend.group_ids`, then
:meth:`TritonBackend.update`):

1. :func:`~neo.embedding.backends.triton_kernels.row_keys_kernel` (a program per bag)
   writes every id's global row key ``row_offsets[t] + id`` (int32 when the group has
   < 2^31 rows; invalid ids get ``total_rows`` and sort last) and its bag;
2. torch ops group them, as FBGEMM does with its radix sort: a stable ``torch.sort`` of the
   keys (each row's occurrences stay in their original order), segment starts from
   ``cumsum`` of "key differs from the previous one" and ``searchsorted``. Nothing syncs
   with the host: the number of segments stays on the device and the grid is sized for
   the worst case (N segments; programs past the last one are fully masked);
3. :func:`~neo.embedding.backends.triton_kernels.fused_backward_update_kernel`: a program
   per ``BLOCK_S`` segments sums each row's gradient over its occurrences (in order, fp32),
   applies the optimizer and writes the row and its state back in place, with stochastic
   rounding where the layout asks. A row is owned by one program: no atomics.

Launch heuristics: ``BLOCK_D`` is the next power of two >= the group's largest D (lanes
past a feature's D are masked); the forward's id tile ``BLOCK_L`` follows the mean bag
length (4 to 8) with one warp a bag, and the update takes 2 to 16 rows a program
(:func:`forward_launch`, :func:`update_launch`: from a sweep on an H200). The
``fwd_*``/``bwd_*`` attributes of the backend override them (tools/gpu_check_triton.py
sweeps them on a GPU).
"""

from __future__ import annotations

import os
from typing import List, Optional

import torch

from neo.config.embedding import OptimizerType, WeightDType
from neo.embedding.layout import GroupLayout

_K_STEP = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1

_OPT_CODE = {
    OptimizerType.SGD: 0,
    OptimizerType.ADAGRAD: 1,
    OptimizerType.ROWWISE_ADAGRAD: 2,
    OptimizerType.ADAM: 3,
    OptimizerType.LAMB: 4,
}
_WKIND = {WeightDType.FP32: 0, WeightDType.FP16: 1, WeightDType.BF16: 2}

_kernels = None


def _get_kernels():
    """Import triton and the kernels on first use (keeps ``import neo`` triton-free)."""
    global _kernels
    if _kernels is None:
        from neo.embedding.backends import triton_kernels
        _kernels = triton_kernels
    return _kernels


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class _Static:
    """Host-side facts of a layout, read from its TableConfigs (no device sync)."""

    def __init__(self, layout: GroupLayout):
        self.layout_ref = layout
        tables = layout.tables
        self.num_features = len(layout.features)
        # the output's columns from the layout's own offsets, read once per layout: a one-feature
        # view of a group (unpooled lookups, neo/embedding/sequence.py) has fewer than its tables
        self.total_dim = int(layout.output_offsets[-1])
        self.total_rows = sum(t.num_rows for t in tables)
        self.max_dim = max(t.dim for t in tables)
        self.block_d = max(4, _next_pow2(self.max_dim))


class TritonBackend:
    """See the module docstring. The ``fwd_*`` / ``bwd_*`` attributes override the launch
    heuristics (None: choose from D and the mean bag length); tools/gpu_check_triton.py
    sweeps them."""

    name = "triton"
    # forward(..., invalid_counts=) adds each feature's invalid ids into a device tensor: what the
    # module's id check and skip count read, instead of a pass of torch operations over the ids
    counts_invalid_per_feature = True

    def __init__(self):
        self._static = {}
        self.fwd_block_l: Optional[int] = None    # ids per tile of the forward gather
        self.fwd_num_warps: Optional[int] = None
        self.bwd_block_s: Optional[int] = None    # unique rows per program of the fused update
        self.bwd_num_warps: Optional[int] = None
        self.last_compiled = {}                   # kernel name -> CompiledKernel of the last launch (CUDA)

    @staticmethod
    def _block_l(n_ids: int, n_bags: int, cap: int) -> int:
        """Ids per tile: the mean bag length rounded up to a power of two, in [4, cap]."""
        avg_len = max(1, -(-n_ids // max(1, n_bags)))
        return max(4, min(_next_pow2(avg_len), cap))

    # ------------------------------------------------------------------ helpers
    def _facts(self, layout: GroupLayout) -> _Static:
        s = self._static.get(id(layout))
        if s is None or s.layout_ref is not layout:
            s = _Static(layout)
            self._static[id(layout)] = s
        return s

    @staticmethod
    def _check_device(t: torch.Tensor) -> None:
        if t.device.type != "cuda" and not _interpreting():
            raise RuntimeError(
                "the triton embedding backend needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                f"triton is imported, to interpret the kernels on CPU); got a tensor on {t.device}"
            )

    @staticmethod
    def _weights_arg(layout: GroupLayout, weights: torch.Tensor) -> torch.Tensor:
        # bf16 goes in as its bits: the kernels convert with integer ops (exact everywhere)
        return weights.view(torch.int16) if layout.dtype is WeightDType.BF16 else weights

    # ------------------------------------------------------------------ forward
    def forward(self, layout, weights, indices, offsets, per_sample_weights, batch_size,
                invalid_counts: Optional[torch.Tensor] = None):
        """(B, sum of D) pooled rows; invalid ids contribute zero. ``invalid_counts``: an (F,)
        int32 tensor on the device, one entry per feature of the group, that the kernel adds each
        feature's invalid ids into (no host synchronisation; the module's id check and skip
        count read it, :attr:`counts_invalid_per_feature`)."""
        k = _get_kernels()
        self._check_device(weights)
        st = self._facts(layout)
        B, F = int(batch_size), st.num_features
        out = torch.empty(B, st.total_dim, dtype=torch.float32, device=weights.device)
        if B == 0 or F == 0:
            return out
        indices = indices.contiguous()
        offsets = offsets.contiguous()
        N = indices.numel()
        has_psw = per_sample_weights is not None
        psw = per_sample_weights.contiguous().to(torch.float32) if has_psw else out  # dummy pointer
        BLOCK_D = st.block_d
        BLOCK_L, num_warps = forward_launch(BLOCK_D, self._block_l(N, F * B, 8))
        BLOCK_L, num_warps = self.fwd_block_l or BLOCK_L, self.fwd_num_warps or num_warps
        self.last_compiled["forward"] = k.pooled_forward_kernel[(F * B,)](
            self._weights_arg(layout, weights), indices, offsets, psw, out,
            layout.feature_table, layout.table_rows, layout.table_dims, layout.weight_offsets,
            layout.output_offsets, layout.feature_mean,
            out if invalid_counts is None else invalid_counts,   # a dummy pointer when not counting
            B, st.total_dim,
            HAS_PSW=has_psw, WKIND=_WKIND[layout.dtype],
            BLOCK_L=BLOCK_L, BLOCK_D=BLOCK_D, COUNT=invalid_counts is not None,
            num_warps=num_warps, enable_fp_fusion=False,
        )
        return out

    # ------------------------------------------------------- backward + update
    def group_ids(self, layout, indices, offsets, per_sample_weights, batch_size):
        """Grouping of the ids by global row, without a host synchronisation.

        Returns ``(key_sorted, bag_sorted, psw_sorted, seg_start, num_segs)``: sorted keys
        (int32 where the group has < 2^31 rows), each sorted id's bag, the per-id weights in
        sorted order (or None), the first sorted position of every segment (``N`` past the
        last one) and the number of segments as a 1-element device tensor.
        """
        k = _get_kernels()
        st = self._facts(layout)
        B, N, dev = int(batch_size), indices.numel(), indices.device
        key_dtype = torch.int32 if st.total_rows < 2**31 - 1 else torch.int64
        keys = torch.empty(N, dtype=key_dtype, device=dev)
        bags = torch.empty(N, dtype=torch.int32, device=dev)
        n_bags = offsets.numel() - 1
        self.last_compiled["row_keys"] = k.row_keys_kernel[(n_bags,)](
            indices, offsets, keys, bags,
            layout.feature_table, layout.table_rows, layout.row_offsets,
            B, st.total_rows, BLOCK_L=self._block_l(N, n_bags, 32), num_warps=1,
        )
        key_sorted, perm = torch.sort(keys, stable=True)        # stable: occurrence order kept
        bag_sorted = bags[perm]
        psw_sorted = None if per_sample_weights is None else per_sample_weights.to(torch.float32)[perm]
        is_start = torch.ones(N, dtype=torch.bool, device=dev)
        torch.ne(key_sorted[1:], key_sorted[:-1], out=is_start[1:])
        seg_id = torch.cumsum(is_start, 0)                       # 1-based segment of each position
        num_segs = seg_id[-1:]
        seg_start = torch.searchsorted(seg_id, torch.arange(1, N + 2, device=dev))  # (N + 1,)
        return key_sorted, bag_sorted, psw_sorted, seg_start, num_segs

    def update(self, layout, weights, states, grad_output, offsets, groups, batch_size, lr, step, seed):
        """The fused kernel alone, on the output of :meth:`group_ids`."""
        k = _get_kernels()
        st = self._facts(layout)
        key_sorted, bag_sorted, psw_sorted, seg_start, num_segs = groups
        N = key_sorted.numel()
        opt = layout.optimizer
        b1, b2 = opt.beta1, opt.beta2
        bc1, bc2 = 1.0 - b1 ** step, 1.0 - b2 ** step          # Python doubles, fp32 in the kernel as in torch
        s0 = states[0] if len(states) > 0 else grad_output    # dummies where unused
        s1 = states[1] if len(states) > 1 else grad_output
        sr = bool(layout.stochastic_rounding) and layout.dtype is not WeightDType.FP32
        sr_key = _signed64((seed & _MASK64) ^ ((step * _K_STEP) & _MASK64))
        BLOCK_D = st.block_d
        BLOCK_S, num_warps = update_launch(BLOCK_D)
        BLOCK_S, num_warps = self.bwd_block_s or BLOCK_S, self.bwd_num_warps or num_warps
        grid = (triton_cdiv(N, BLOCK_S),)                      # N segments at most
        self.last_compiled["update"] = k.fused_backward_update_kernel[grid](
            self._weights_arg(layout, weights), s0, s1, grad_output,
            seg_start, num_segs, key_sorted, bag_sorted,
            psw_sorted if psw_sorted is not None else grad_output, offsets,
            layout.feature_table, layout.table_dims, layout.weight_offsets, layout.row_offsets,
            layout.output_offsets, layout.feature_mean,
            int(batch_size), st.total_dim, st.total_rows,
            float(lr), float(opt.eps), float(opt.weight_decay),
            float(b1), float(1.0 - b1), float(b2), float(1.0 - b2),
            float(bc1) if bc1 != 0 else 1.0, float(bc2) if bc2 != 0 else 1.0,
            sr_key,
            OPT=_OPT_CODE[opt.type], WKIND=_WKIND[layout.dtype], SR=sr,
            HAS_PSW=psw_sorted is not None, HAS_WD=bool(opt.weight_decay),
            BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D,
            num_warps=num_warps, enable_fp_fusion=False,
        )

    def backward_update(self, layout, weights, states: List[torch.Tensor], grad_output, indices, offsets,
                        per_sample_weights: Optional[torch.Tensor], batch_size, lr, step, seed):
        self._check_device(weights)
        if indices.numel() == 0 or int(batch_size) == 0:
            return
        indices = indices.contiguous()
        offsets = offsets.contiguous()
        grad_output = grad_output.contiguous().to(torch.float32)
        groups = self.group_ids(layout, indices, offsets, per_sample_weights, batch_size)
        self.update(layout, weights, states, grad_output, offsets, groups, batch_size, lr, step, seed)


def forward_launch(block_d: int, block_l: int) -> tuple:
    """(BLOCK_L, num_warps) of the forward: ``block_l`` ids a tile (the mean bag length, 4 to
    8), one warp a bag up to D 256. Measured on an H200 (2026-11-30, tools/gpu_check_triton.py
    --sweep, 8 tables x 1M rows, batch 4096, 20 ids a bag): 8 ids x 1 warp was the fastest or
    within 1% of it at D 64, 128 and 256 (56%, 72% and 86% of a device copy's bandwidth); the
    earlier rule (32 ids x 4 warps at D 64, 32 x 8 at D 128, 16 x 8 at D 256) took 1.6x, 3.5x
    and 2.2x as long in the same sweep. Wider rows (unmeasured): 4 ids, 2 warps."""
    if block_d > 256:
        return 4, 2
    return block_l, 1


def update_launch(block_d: int) -> tuple:
    """(BLOCK_S, num_warps) of the fused update: rows a program and warps. The H200 sweep of
    2026-11-30 (as :func:`forward_launch`; row-wise Adagrad fp32): 4 rows x 2 warps at D 64
    (228.8 us, against 281 us for the earlier 16 x 4), 2 x 2 at D 128 (398 against 438), 2 x 1
    at D 256 (616 against 800). BLOCK_S stays at most 16: with Triton 3.6, 32 rows and 2 or
    more warps fail to compile (a layout pass rejects the masked load of the bags; Triton 3.9
    compiles them, checked for sm_90 without a GPU)."""
    if block_d >= 256:
        return 2, 1
    return max(2, min(16, 256 // block_d)), 2


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
