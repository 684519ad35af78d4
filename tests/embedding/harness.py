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
        torch.testing.assert_close(out_fast.cpu(), out_ref, rtol=rtol, atol=atol, msg=lambda m: f"step {step} forward: {m}")
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad.to(device))
        assert_close_modules(ref, fast, rtol, atol, what=f"{backend} step {step}")
