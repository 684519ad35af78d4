"""Shared checks of embedding backends against the reference oracle.

``random_batch`` makes batches with every awkward case at once: duplicate ids within a
bag and across bags, empty bags, long bags, shared tables (two features on one table),
per-id weights. ``run_steps`` trains two modules on the same batches and gradients and
compares outputs, weights and optimizer state after every step.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

import torch

from neo.config.embedding import TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.embedding.backends.reference import sr_uniform
from neo.sparse import KeyedJaggedBatch


def random_batch(
    tables: Sequence[TableConfig],
    batch_size: int,
    gen: torch.Generator,
    max_len: int = 8,
    long_bag: int = 0,
    weighted: bool = False,
    hot_fraction: float = 0.3,
) -> KeyedJaggedBatch:
    """A batch over all features of ``tables``; ~``hot_fraction`` of ids hit a few hot rows."""
    keys, values, lengths = [], [], []
    for t in tables:
        for f in t.feature_names:
            keys.append(f)
            lens = torch.randint(0, max_len + 1, (batch_size,), generator=gen)
            lens[torch.rand(batch_size, generator=gen) < 0.2] = 0              # empty bags
            if long_bag and batch_size > 1:
                lens[1] = long_bag                                             # one long bag
            n = int(lens.sum())
            ids = torch.randint(0, t.num_rows, (n,), generator=gen)
            hot = torch.rand(n, generator=gen) < hot_fraction
            ids[hot] = torch.randint(0, min(3, t.num_rows), (int(hot.sum()),), generator=gen)  # duplicates
            values.append(ids)
            lengths.append(lens)
    values_t = torch.cat(values)
    weights = torch.rand(values_t.numel(), generator=gen) + 0.5 if weighted else None
    return KeyedJaggedBatch(tuple(keys), values_t, torch.cat(lengths), batch_size, weights=weights)


def clone_weights(src: TableBatchedEmbedding, dst: TableBatchedEmbedding) -> None:
    for t in src.tables:
        dst.table_weight(t.name).copy_(src.table_weight(t.name))


def assert_close_modules(a: TableBatchedEmbedding, b: TableBatchedEmbedding, rtol: float, atol: float, what: str = "") -> None:
    for t in a.tables:
        wa, wb = a.table_weight(t.name).float(), b.table_weight(t.name).float().cpu()
        torch.testing.assert_close(wb, wa, rtol=rtol, atol=atol, msg=lambda m: f"{what} table {t.name} weights: {m}")
        sa, sb = a.table_optimizer_state(t.name), b.table_optimizer_state(t.name)
        assert sa.keys() == sb.keys()
        for k in sa:
            torch.testing.assert_close(sb[k].cpu(), sa[k], rtol=rtol, atol=atol, msg=lambda m: f"{what} table {t.name} state {k}: {m}")


def summation_slack(ref: TableBatchedEmbedding, batch: KeyedJaggedBatch,
                    other: Optional[Mapping[str, torch.Tensor]] = None) -> torch.Tensor:
    """(B, sum of D): per pooled element, the most two fp32 sums of a bag's n terms in different
    orders can differ, ``2 (n - 1) u sum |term|`` (u = 2^-24; Higham, *Accuracy and Stability of
    Numerical Algorithms*, 4.2), divided by n for mean bags. Where a long bag's terms cancel, the
    kernels' order against the reference's moves the result by more than a relative tolerance
    of the (small) sum allows, with nothing wrong.

    ``other``: table name -> the weights the other side pools, where they may differ from
    ``ref``'s (two trainings after their first update, each within the weights' tolerance of the
    other): then also ``sum |a_i| |w_i - w'_i|`` over the bag's terms (a_i its per-id weight, 1
    without), exactly what that difference moves the pooled sum by at most. Seed shift 511: after
    two Adagrad steps, a bag of 50 rows (weights within 1e-5 of the reference's) pooled to
    0.0561188 against 0.0561214, beyond the summation order's 1.2e-7."""
    cols = []
    for t in ref.tables:                                   # the output's order: tables, then features
        w_ref = ref.table_weight(t.name).detach().float().cpu()
        gap = None if other is None else (w_ref - other[t.name].detach().float().cpu()).abs()
        for f in t.feature_names:
            ids, lengths, weights = batch.feature(f)
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]]).cpu().long()
            a = None if weights is None else weights.abs().cpu()

            def pooled(w: torch.Tensor) -> torch.Tensor:
                return torch.nn.functional.embedding_bag(ids.cpu().long(), w, offsets, mode="sum", per_sample_weights=a)

            n = lengths.cpu().clamp(min=1).to(torch.float32).unsqueeze(1)                  # (B, 1)
            slack = 2 * (n - 1) * 2.0 ** -24 * pooled(w_ref.abs())
            if gap is not None:
                slack = slack + pooled(gap)
            cols.append(slack / n if t.pooling.value == "mean" else slack)
    return torch.cat(cols, dim=1)


def assert_pooled_close(got: torch.Tensor, expected: torch.Tensor, slack: torch.Tensor, rtol: float, atol: float,
                        what: str) -> None:
    """``|got - expected| <= atol + rtol |expected| + slack`` element by element (see :func:`summation_slack`)."""
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} against {tuple(expected.shape)}"
    excess = (got - expected).abs() - (atol + rtol * expected.abs() + slack)
    if bool((excess > 0).any()) or bool(torch.isnan(got).ne(torch.isnan(expected)).any()):
        i = int(excess.nan_to_num(float("inf")).argmax())
        r, c = divmod(i, got.shape[1])
        raise AssertionError(f"{what}: {int((excess > 0).sum())} of {got.numel()} elements out of bounds; worst at "
                             f"({r}, {c}): {float(got[r, c]):.9g} against {float(expected[r, c]):.9g}, allowed "
                             f"{atol:g} + {rtol:g} x |expected| + summation slack {float(slack[r, c]):.3g}")


def run_steps(
    tables: Sequence[TableConfig],
    backend: str,
    steps: int = 3,
    batch_size: int = 16,
    seed: int = 0,
    weighted: bool = False,
    long_bag: int = 0,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    device: str = "cpu",
    batches: Optional[List[KeyedJaggedBatch]] = None,
) -> None:
    """Train a ``backend`` module and a ``reference`` one on identical input; compare every step."""
    ref = TableBatchedEmbedding(tables, backend="reference", seed=seed)
    fast = TableBatchedEmbedding(tables, backend=backend, seed=seed, device=device)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        batch = batches[step] if batches else random_batch(tables, batch_size, gen, weighted=weighted, long_bag=long_bag)
        out_ref = ref(batch)
        out_fast = fast(batch.to(device))
        other = {t.name: fast.table_weight(t.name) for t in ref.tables} if step else None   # equal at step 0
        assert_pooled_close(out_fast.cpu(), out_ref, summation_slack(ref, batch, other), rtol, atol, f"step {step} forward")
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad.to(device))
        assert_close_modules(ref, fast, rtol, atol, what=f"{backend} step {step}")


def ulp_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place between two fp16/bf16 tensors of finite values."""
    def ordered(x):
        i = x.view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (ordered(a) - ordered(b)).abs()


def sr_uniforms(module: TableBatchedEmbedding, name: str, step: int) -> torch.Tensor:
    """(rows, D): the uniforms with which update ``step`` (1, 2, ..) rounded table ``name``'s
    elements stochastically, the reference's and the kernels' (one counter-based stream)."""
    g, t, _ = module._locate(name)
    rows, D, off = int(g.layout.table_rows[t]), int(g.layout.table_dims[t]), int(g.layout.weight_offsets[t])
    return sr_uniform(module.rounding_seed, step, off + torch.arange(rows).unsqueeze(1) * D + torch.arange(D))


def assert_16bit_update_close(ref: TableBatchedEmbedding, table: TableConfig, step: int, before: torch.Tensor,
                              want: torch.Tensor, got: torch.Tensor, where: str) -> None:
    """Update ``step`` (1, 2, ..) of a 16-bit table by an optimizer that reduces across the row
    (row-wise Adagrad's mean of g^2, LAMB's norms), ``got`` against the reference module ``ref``'s
    ``want``, from the weights ``before`` it (fp32): equal but for 1 ulp on a small share of
    elements, and the two exceptions below, each bounded by what the fp32 arithmetic allows."""
    d = ulp_diff(want, got)
    # Where the update nearly cancels the weight (w - u, u ~ w) the result is small and its
    # 16-bit ulp finer than the fp32 update's own error at the operands' scale: there the
    # two may differ by that error instead. It is the update's rounding (a few fp32 ulps
    # of max(|w|, |u|); seeds shifted by 97: 0.0664 - 0.0664 gave 1.64e-7 and 1.71e-7, 8
    # bf16 ulps apart, 1 fp32 ulp of 0.0664) plus, for row-wise Adagrad, the row's mean
    # of g^2 summed in another order: D nonnegative terms, so at most (D - 1) eps of the
    # mean, and u ~ 1 / sqrt(sum) moves by at most half that relatively (seeds shifted by
    # 199, D 72: 8.05e-6 and 8.17e-6 from w = -0.0474, 1.2e-7 apart: 2 bf16 ulps, 21 eps of |u|).
    u = before - want.float()
    rel = 4 + (table.dim - 1) / 2 if table.optimizer.type.value == "rowwise_adagrad" else 4
    operand = rel * torch.finfo(torch.float32).eps * torch.maximum(before.abs(), u.abs())
    gap = (want.float() - got.float()).abs()
    d = torch.where(gap <= operand, torch.zeros_like(d), d)
    if table.stochastic_rounding:
        # Stochastic rounding goes from the nearest 16-bit value r to its neighbour on x's side
        # when u < |x - r| / ulp, u the element's uniform (the same in both). Two fp32 results a
        # hair apart on either side of a 16-bit value m (both nearest to m) can so both step
        # away from it, 2 ulps apart, when u ulp is under each one's distance to m, so
        # u |want - got| = 2 u ulp < |x_want - x_got| <= operand. Seeds shifted by 421 (bf16,
        # row-wise Adagrad, a 500-id bag): w 0.0464 less an update of 0.04637 gave 1.5378e-5
        # and 1.5616e-5, 2 ulps around 2^-16 + 2 ulps, u 0.0113. Only such a pair is excused.
        across = (d == 2) & (sr_uniforms(ref, table.name, step) * gap < operand)
        d = torch.where(across, torch.zeros_like(d), d)
    assert int(d.max()) <= 1, f"{where}: weights differ by {int(d.max())} ulp"
    assert int((d > 0).sum()) <= max(2, want.numel() // 100), f"{where}: {int((d > 0).sum())} weights differ by 1 ulp"
