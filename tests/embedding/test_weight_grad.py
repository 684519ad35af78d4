"""The gradient of per-id weights that require grad (TorchRec's position-weighted features).

The oracle is plain PyTorch on a copy of the tables taken before the step:
``torch.nn.functional.embedding_bag(..., per_sample_weights=w)`` for sum pooling, and the
pooled sum divided by the bag lengths for mean pooling, differentiated by autograd. The
tables' fused update must be the one the same batch makes with its weights detached.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import EmbeddingInputError, TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch
from tests.embedding.harness import random_batch

OPT = OptimizerConfig("rowwise_adagrad", lr=0.1)


def _tables(pooling: str = "sum", dtype: str = "fp32", **kw):
    return [TableConfig("a", 30, 8, feature_names=("a1", "a2"), pooling=pooling, dtype=dtype, optimizer=OPT, **kw),
            TableConfig("b", 17, 4, pooling=pooling, dtype=dtype, optimizer=OptimizerConfig("sgd", lr=0.2), **kw),
            TableConfig("c", 40, 16, pooling=pooling, dtype=dtype, optimizer=OPT, **kw)]


def _oracle(tbe: TableBatchedEmbedding, tables, before, batch: KeyedJaggedBatch, grad: torch.Tensor,
            pooled_bags=None) -> torch.Tensor:
    """d (out * grad).sum() / d weights in plain PyTorch; ``before``: the tables' fp32 values at the lookup."""
    w = batch.weights.detach().clone().requires_grad_()
    B, cols = batch.batch_size, tbe.feature_slices()
    table_of = {f: t for t in tables for f in t.feature_names}
    loss = torch.zeros(())
    for k, f in enumerate(batch.keys):
        t = table_of[f]
        off = batch.offsets[k * B:(k + 1) * B + 1]
        ids, wf = batch.values[off[0]:off[-1]], w[off[0]:off[-1]]
        bag_off = off[:-1] - off[0]
        if pooled_bags is not None:                # the unpooled bags' weights do not reach the output
            keep = torch.repeat_interleave(pooled_bags[k * B:(k + 1) * B], off[1:] - off[:-1])
            wf = wf * keep
        pooled = F.embedding_bag(ids, before[t.name], bag_off, mode="sum", per_sample_weights=wf)   # (B, D)
        if t.pooling.value == "mean":
            pooled = pooled / (off[1:] - off[:-1]).clamp(min=1).unsqueeze(1)
        loss = loss + (pooled * grad[:, cols[f]]).sum()
    loss.backward()
    return w.grad


def _step(tbe, batch, grad, learnable: bool, **kw):
    w = batch.weights.detach().clone().requires_grad_(learnable)
    b = KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, batch.batch_size, weights=w)
    out = tbe(b, **kw)
    out.backward(grad)
    return out.detach(), w.grad


CASES = [(b, p, d) for b in ("reference", "cpu") for p in ("sum", "mean") for d in ("fp32", "fp16")] + [
    ("fbgemm", "sum", "fp32")]      # FBGEMM's CPU TBE: weighted bags sum-pooled only


@pytest.mark.parametrize("backend, pooling, dtype", CASES)
def test_weight_grad_matches_plain_pytorch(backend, pooling, dtype):
    tables = _tables(pooling, dtype)
    gen = torch.Generator().manual_seed(5)
    learn = TableBatchedEmbedding(tables, backend=backend, seed=3)
    fixed = TableBatchedEmbedding(tables, backend=backend, seed=3)
    for step in range(3):
        batch = random_batch(tables, 6, gen, weighted=True, long_bag=20)
        grad = torch.randn(6, learn.output_dim, generator=gen)
        before = {t.name: learn.table_weight(t.name).float().clone() for t in tables}
        out, wgrad = _step(learn, batch, grad, learnable=True)
        out_fixed, none = _step(fixed, batch, grad, learnable=False)
        assert none is None and torch.equal(out, out_fixed), step
        want = _oracle(learn, tables, before, batch, grad)
        torch.testing.assert_close(wgrad, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: {m}")
        for t in tables:    # the same update as with the weights detached, bit for bit
            assert torch.equal(learn.table_weight(t.name), fixed.table_weight(t.name)), (step, t.name)
            assert not torch.equal(learn.table_weight(t.name).float(), before[t.name]), (step, t.name)


def test_weight_grad_of_bad_ids_unchecked_is_zero():
    """validate=False: an id outside its table pools nothing, so its weight gets a zero gradient."""
    tables = _tables()
    tbe = TableBatchedEmbedding(tables, backend="cpu", validate=False, seed=1)
    batch = random_batch(tables, 5, torch.Generator().manual_seed(2), weighted=True)
    bad = torch.tensor([0, 3, batch.values.numel() - 1])
    batch.values[bad] = torch.tensor([-1, 10_000, 40])
    grad = torch.randn(5, tbe.output_dim, generator=torch.Generator().manual_seed(3))
    before = {t.name: tbe.table_weight(t.name).float().clone() for t in tables}
    _, wgrad = _step(tbe, batch, grad, learnable=True)
    assert torch.equal(wgrad[bad], torch.zeros(3))
    ok = torch.ones(batch.values.numel())
    ok[bad] = 0
    clean = KeyedJaggedBatch(batch.keys, torch.where(ok > 0, batch.values, 0), batch.lengths, 5,
                             weights=batch.weights * ok)                  # the bad ids as weight-0 row-0 ids
    want = _oracle(tbe, tables, before, clean, grad)
    good = torch.ones_like(wgrad, dtype=torch.bool)
    good[bad] = False
    torch.testing.assert_close(wgrad[good], want[good], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_weight_grad_in_eval_mode_updates_nothing(backend):
    tables = _tables("mean")
    tbe = TableBatchedEmbedding(tables, backend=backend, seed=4).eval()
    gen = torch.Generator().manual_seed(6)
    batch = random_batch(tables, 4, gen, weighted=True)
    grad = torch.randn(4, tbe.output_dim, generator=gen)
    before = {t.name: tbe.table_weight(t.name).clone() for t in tables}
    _, wgrad = _step(tbe, batch, grad, learnable=True)
    torch.testing.assert_close(wgrad, _oracle(tbe, tables, {k: v.float() for k, v in before.items()}, batch, grad),
                               rtol=1e-5, atol=1e-6)
    assert all(torch.equal(tbe.table_weight(t.name), before[t.name]) for t in tables)
    assert int(tbe.group0_step) == 0


def test_weight_grad_of_unpooled_bags_is_zero():
    """``pooled_bags``: the other bags come out as zeros whatever their weights (their update still runs)."""
    tables = _tables()
    tbe = TableBatchedEmbedding(tables, backend="cpu", seed=2)
    gen = torch.Generator().manual_seed(8)
    batch = random_batch(tables, 5, gen, weighted=True)
    mask = torch.rand(len(batch.keys) * 5, generator=gen) < 0.5
    grad = torch.randn(5, tbe.output_dim, generator=gen)
    before = {t.name: tbe.table_weight(t.name).float().clone() for t in tables}
    _, wgrad = _step(tbe, batch, grad, learnable=True, pooled_bags=mask)
    torch.testing.assert_close(wgrad, _oracle(tbe, tables, before, batch, grad, pooled_bags=mask),
                               rtol=1e-5, atol=1e-6)
    unpooled = ~torch.repeat_interleave(mask, batch.lengths)
    assert unpooled.any() and torch.equal(wgrad[unpooled], torch.zeros(int(unpooled.sum())))


def test_weight_grad_of_cached_tables():
    """Cached tables read their rows from the cache's slots: the same gradient as device tables;
    in eval mode (the cache keeps no rows for a backward) a clear error instead."""
    cached = _tables(placement="cached", cache_rows=16, cache_store="host")
    plain = _tables()
    a = TableBatchedEmbedding(cached, backend="cpu", seed=7)
    b = TableBatchedEmbedding(plain, backend="cpu", seed=7)
    gen = torch.Generator().manual_seed(9)
    for step in range(3):
        batch = random_batch(plain, 2, gen, weighted=True, max_len=4, hot_fraction=0.5)
        grad = torch.randn(2, a.output_dim, generator=gen)
        out_a, g_a = _step(a, batch, grad, learnable=True)
        out_b, g_b = _step(b, batch, grad, learnable=True)
        assert torch.equal(out_a, out_b) and torch.equal(g_a, g_b), step
    a.eval()
    with pytest.raises(EmbeddingInputError, match=r"eval mode, with cached tables \(a, b, c\)"):
        _step(a, batch, grad, learnable=True)
    with torch.no_grad():
        a(batch)                                   # evaluation as usual


def test_variable_batch_weight_grad():
    """A variable-batch torchrec KeyedJaggedTensor: samples that share a bag share its weights' gradient."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    tables = [TableConfig("t", 10, 4, optimizer=OPT)]
    tbe = TableBatchedEmbedding(tables, backend="cpu", seed=0)
    w = torch.tensor([0.5, 1.5, 2.0], requires_grad=True)
    kjt = KeyedJaggedTensor(keys=["t"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]), weights=w,
                            stride_per_key_per_rank=[[2]],
                            inverse_indices=(["t"], torch.tensor([[0, 1, 0]])))
    before = tbe.table_weight("t").clone()
    grad = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    tbe(kjt).backward(grad)
    g0, g1 = grad[0] + grad[2], grad[1]                 # samples 0 and 2 share bag 0
    want = torch.stack([before[1] @ g0, before[2] @ g0, before[3] @ g1])
    torch.testing.assert_close(w.grad, want, rtol=1e-5, atol=1e-6)


def test_torchrec_position_weights_learn_as_under_torchrec():
    """TorchRec's PositionWeightedModuleCollection in front of Neo's lookup: its position weights
    get the gradient they get in front of TorchRec's weighted EmbeddingBagCollection."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(4)
    lengths = torch.tensor([3, 0, 4, 1, 2, 4])                       # features f, g: 3 samples each
    kjt = KeyedJaggedTensor(keys=["f", "g"], values=torch.randint(0, 10, (14,), generator=gen), lengths=lengths)
    pw = PositionWeightedModuleCollection(max_feature_lengths={"f": 4, "g": 4})
    with torch.no_grad():
        for p in pw.position_weights.values():
            p.copy_(torch.rand(4, generator=gen) + 0.5)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=10,
                                                            feature_names=["f", "g"])], is_weighted=True)
    tbe = TableBatchedEmbedding([TableConfig("t", 10, 8, feature_names=("f", "g"), optimizer=OPT)], backend="cpu")
    with torch.no_grad():
        tbe.table_weight("t").copy_(ebc.embedding_bags["t"].weight)
    grad = torch.randn(3, 16, generator=gen)
    grads = []
    for lookup in (lambda k: ebc(k).values(), tbe):
        pw.zero_grad(set_to_none=True)
        lookup(pw(kjt)).backward(grad)
        grads.append({f: p.grad.clone() for f, p in pw.position_weights.items()})
    for f in ("f", "g"):
        assert grads[0][f].abs().sum() > 0
        torch.testing.assert_close(grads[1][f], grads[0][f], rtol=1e-5, atol=1e-6, msg=lambda m: f"{f}: {m}")
