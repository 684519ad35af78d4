"""Shared checks of embedding backends against the reference oracle.

``random_batch`` makes batches with every awkward case at once: duplicate ids within a
bag and across bags, empty bags, long bags, shared tables (two features on one table),
per-id weights. ``run_steps`` trains two modules on the same batches and gradients and
compares outputs, weights and optimizer state after every step.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from neo.config.embedding import TableConfig
from neo.embedding import TableBatchedEmbedding
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


def summation_slack(ref: TableBatchedEmbedding, batch: KeyedJaggedBatch) -> torch.Tensor:
    """(B, sum of D): per pooled element, the most two fp32 sums of a bag's n terms in different
    orders can differ, ``2 (n - 1) u sum |term|`` (u = 2^-24; Higham, *Accuracy and Stability of
    Numerical Algorithms*, 4.2), divided by n for mean bags. Where a long bag's terms cancel, the
    kernels' order against the reference's moves the result by more than a relative tolerance
    of the (small) sum allows, with nothing wrong."""
    cols = []
    for t in ref.tables:                                   # the output's order: tables, then features
        w_abs = ref.table_weight(t.name).detach().float().abs().cpu()
        for f in t.feature_names:
            ids, lengths, weights = batch.feature(f)
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
            terms = torch.nn.functional.embedding_bag(ids.cpu().long(), w_abs, offsets.cpu().long(), mode="sum",
                                                      per_sample_weights=None if weights is None else weights.abs().cpu())
            n = lengths.cpu().clamp(min=1).to(torch.float32).unsqueeze(1)                  # (B, 1)
            slack = 2 * (n - 1) * 2.0 ** -24 * terms
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
        assert_pooled_close(out_fast.cpu(), out_ref, summation_slack(ref, batch), rtol, atol, f"step {step} forward")
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad.to(device))
        assert_close_modules(ref, fast, rtol, atol, what=f"{backend} step {step}")
