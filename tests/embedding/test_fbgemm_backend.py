"""The fbgemm backend (FBGEMM's CPU TBE aliasing Neo's buffers) against the reference."""

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch

from harness import run_steps

import fbgemm_gpu  # noqa: E402,F401


# Adagrad from a zero accumulator updates an element by lr g / (|g| + eps) on its first step, whose
# derivative lr eps / (|g| + eps)^2 is up to lr / (4 eps) where the summed gradient g nearly cancels:
# FBGEMM's and the reference's summation orders then move the weight by more than any tolerance,
# with nothing wrong (seeds shifted by 97: g = 7e-7, 0.5% apart by order, weights 7e-6 apart).
# From 0.01 (as tests/embedding/test_cpu_backend.py starts it) the derivative is at most lr / 0.1.
OPTS = [OptimizerConfig("sgd", lr=0.1), OptimizerConfig("adagrad", lr=0.1, initial_accumulator_value=0.01),
        OptimizerConfig("rowwise_adagrad", lr=0.1)]


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("opt", OPTS, ids=lambda o: f"{o.type.value}-wd{o.weight_decay}")
def test_fbgemm_matches_reference(opt, pooling):
    tables = [TableConfig("a", 20, 4, feature_names=("a1", "a2"), pooling=pooling, optimizer=opt),
              TableConfig("b", 9, 12, pooling=pooling, optimizer=opt),
              TableConfig("c", 30, 64, pooling=pooling, optimizer=opt)]
    run_steps(tables, "fbgemm", steps=3, batch_size=8, weighted=(pooling == "sum"), long_bag=50)


def test_fbgemm_fp16_close_to_reference():
    opt = OptimizerConfig("rowwise_adagrad", lr=0.05)
    tables = [TableConfig("a", 16, 8, dtype="fp16", optimizer=opt, stochastic_rounding=False)]
    # Within 1 ulp of the fp16 storage (ulp(x) <= 2^-10 |x|): FBGEMM sums the row's squared
    # gradient in another order, so a rounding to fp16 may land on the neighbour. Measured over
    # 40 seeds x 3 steps (tables of 8 and 64 columns, bags up to 20): at most 1 ulp, the forward
    # within 1e-6 relative.
    run_steps(tables, "fbgemm", steps=2, batch_size=4, rtol=2.0 ** -10, atol=2.0 ** -24)


def test_fbgemm_rejects_what_fbgemm_cpu_lacks():
    emb = TableBatchedEmbedding([TableConfig("a", 4, 4, optimizer=OptimizerConfig("adam"))], backend="fbgemm")
    with pytest.raises(NotImplementedError, match="not 'adam'"):
        emb(KeyedJaggedBatch.from_lists({"a": [[1]]}))
    emb = TableBatchedEmbedding([TableConfig("a", 4, 4, optimizer=OptimizerConfig("adagrad", weight_decay=0.1))], backend="fbgemm")
    with pytest.raises(NotImplementedError, match="weight decay for 'adagrad'"):
        emb(KeyedJaggedBatch.from_lists({"a": [[1]]}))
    emb = TableBatchedEmbedding([TableConfig("a", 4, 4, optimizer=OptimizerConfig("sgd", weight_decay=0.1))], backend="fbgemm")
    with pytest.raises(NotImplementedError, match="weight decay for 'sgd'"):
        emb(KeyedJaggedBatch.from_lists({"a": [[1]]}))
    emb = TableBatchedEmbedding([TableConfig("a", 4, 4, dtype="bf16")], backend="fbgemm")
    with pytest.raises(NotImplementedError, match=r"not 'bf16' \(tables \['a'\]\)"):
        emb(KeyedJaggedBatch.from_lists({"a": [[1]]}))


@pytest.mark.parametrize("opt", OPTS[:2], ids=lambda o: o.type.value)
def test_lookups_before_their_backwards_update_from_their_own_ids(opt):
    """Two lookups, a no-grad one between them, then the backwards in reverse order: each update
    is from its own lookup's ids, as on the reference backend (FBGEMM's graph of each lookup
    travels with its autograd node)."""
    tables = [TableConfig("t", 10, 4, optimizer=opt)]
    mods = {b: TableBatchedEmbedding(tables, backend=b, seed=0) for b in ("reference", "fbgemm")}
    batches = [KeyedJaggedBatch.from_lists({"t": bags}) for bags in ([[0, 1], [1]], [[5], [6, 7]], [[2], [3]])]
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(2, 4, generator=gen) for _ in range(2)]
    for name, m in mods.items():
        o1 = m(batches[0])
        with torch.no_grad():
            m(batches[1])
        o2 = m(batches[2])
        o2.backward(grads[1])
        o1.backward(grads[0])
    torch.testing.assert_close(mods["fbgemm"].table_weight("t"), mods["reference"].table_weight("t"), rtol=1e-6, atol=1e-7)
    moved = (mods["fbgemm"].table_weight("t") != TableBatchedEmbedding(tables, backend="reference", seed=0).table_weight("t")).any(1)
    assert moved.nonzero().flatten().tolist() == [0, 1, 2, 3]


def test_pooled_bags_update_from_every_bag():
    """``pooled_bags`` (data-parallel replicas): the unpooled bags come out as zeros, and the
    update is still from every bag, as on the reference backend."""
    tables = [TableConfig("t", 8, 4, optimizer=OptimizerConfig("sgd", lr=0.5))]
    batch = KeyedJaggedBatch.from_lists({"t": [[0, 1], [2], [3, 4]]})
    flags = torch.tensor([True, False, True])
    got = {}
    for b in ("reference", "fbgemm"):
        m = TableBatchedEmbedding(tables, backend=b, seed=0)
        out = m(batch, pooled_bags=flags)
        out.backward(torch.ones_like(out))
        got[b] = (out.detach(), m.table_weight("t").clone())
    assert torch.equal(got["fbgemm"][0][1], torch.zeros(4))
    torch.testing.assert_close(got["fbgemm"][0], got["reference"][0])
    torch.testing.assert_close(got["fbgemm"][1], got["reference"][1])
