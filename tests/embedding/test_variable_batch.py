"""TorchRec's variable-batch input (VBE): a KeyedJaggedTensor with a batch size per feature and
its inverse indices, looked up as the full batch it stands for. Oracles: the expansion written
out on Python lists; TorchRec's own EmbeddingBagCollection on the same KJT (outputs, and its
weights' gradients under SGD); nn.EmbeddingBag per feature on the expanded batch, sharded."""

from __future__ import annotations

import datetime
import random

import pytest
import torch
from torch import nn

from neo.config import TableConfig
from neo.config.embedding import OptimizerConfig
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch, as_batch, expand_variable_batch, padded_variable_batch
from tests.multiprocess import run_multiprocess

KJT = pytest.importorskip("torchrec.sparse.jagged_tensor").KeyedJaggedTensor


def _random_vbe(seed: int, keys=("a", "b", "c"), B: int = 6, rows: int = 20, weighted: bool = False,
                lengths_dtype=torch.int64, max_bags: int = 0, own: bool = False):
    """A VBE KJT and, as lists, the bags of each feature and the full batch it stands for (with
    ``own``: each feature's own bags instead). ``max_bags``: at most this many bags a feature
    (default B; more than B: some bags no sample reads)."""
    rnd = random.Random(seed)
    bags = {k: [[rnd.randrange(rows) for _ in range(rnd.randrange(4))] for _ in range(rnd.randint(1, max_bags or B))]
            for k in keys}
    inverse = {k: [rnd.randrange(len(bags[k])) for _ in range(B)] for k in keys}
    wbags = {k: [[rnd.random() for _ in bag] for bag in bags[k]] for k in keys}
    inv_keys = list(keys)[::-1]                         # TorchRec lets them come in another order
    kjt = KJT(keys=list(keys), values=torch.tensor([i for k in keys for bag in bags[k] for i in bag], dtype=torch.int64),
              lengths=torch.tensor([len(bag) for k in keys for bag in bags[k]], dtype=lengths_dtype),
              weights=torch.tensor([w for k in keys for bag in wbags[k] for w in bag]) if weighted else None,
              stride_per_key_per_rank=[[len(bags[k])] for k in keys],
              inverse_indices=(inv_keys, torch.tensor([inverse[k] for k in inv_keys])))
    full = {k: [bags[k][j] for j in inverse[k]] for k in keys}
    full_w = {k: [wbags[k][j] for j in inverse[k]] for k in keys}
    if own:
        return kjt, bags, wbags
    return kjt, full, full_w


@pytest.mark.parametrize("kernel", ["jagged_take", "torch"])
@pytest.mark.parametrize("seed", range(8))
def test_the_expansion_is_the_full_batch_written_out(seed, kernel, monkeypatch):
    if kernel == "torch":                                  # the path without neo._C (or off the CPU)
        monkeypatch.setattr("neo.cpp.cpu_kernels", lambda op: None)
    kjt, full, full_w = _random_vbe(seed, weighted=seed % 2 == 1, lengths_dtype=torch.int32 if seed % 3 else torch.int64)
    got = expand_variable_batch(kjt)
    assert got.batch_size == 6 and got.to_dict() == full
    assert got.lengths.dtype == kjt.lengths().dtype
    if seed % 2:
        want = torch.tensor([w for k in full_w for bag in full_w[k] for w in bag])
        assert torch.equal(got.weights, want)
    assert as_batch(kjt).to_dict() == full                # what every module calls on its input


@pytest.mark.parametrize("seed", range(4))
def test_the_padded_batch_holds_each_distinct_bag_once(seed):
    """What a TableBatchedEmbedding looks up: each feature's B_f bags, then empty ones up to
    max B_f; its inverse indices pick each sample's."""
    kjt, full, _ = _random_vbe(seed)
    padded, inverse = padded_variable_batch(kjt)
    strides = dict(zip(kjt.keys(), kjt.stride_per_key()))
    Bp = max(strides.values())
    assert padded.batch_size == Bp and torch.equal(padded.values, kjt.values())
    for k, bags in padded.to_dict().items():
        assert bags[strides[k]:] == [[]] * (Bp - strides[k])
        assert [bags[j] for j in inverse[k].tolist()] == full[k]


def _tables(lr: float):
    opt = OptimizerConfig("sgd", lr=lr)
    return [TableConfig("t0", 20, 4, feature_names=("a", "b"), optimizer=opt),
            TableConfig("t1", 20, 8, feature_names=("c",), pooling="mean", optimizer=opt)]


def _torchrec_ebc(emb: TableBatchedEmbedding):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    cfgs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                               feature_names=list(t.feature_names),
                               pooling=PoolingType.MEAN if t.pooling.value == "mean" else PoolingType.SUM)
            for t in emb.tables]
    ebc = EmbeddingBagCollection(tables=cfgs)
    with torch.no_grad():
        for t in emb.tables:
            ebc.embedding_bags[t.name].weight.copy_(emb.table_weight(t.name))
    return ebc


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_outputs_and_sgd_updates_equal_torchrecs_embedding_bag_collection(backend):
    lr = 0.1
    emb = TableBatchedEmbedding(_tables(lr), backend=backend, seed=4)
    ebc = _torchrec_ebc(emb)
    for step in range(3):
        kjt, _, _ = _random_vbe(100 + step)
        g = torch.randn(6, 16, generator=torch.Generator().manual_seed(step))
        out = emb(kjt)                                          # (B, 4 + 4 + 8)
        theirs = ebc(kjt)
        assert out.shape == (6, 16) and theirs.values().shape == (6, 16)
        for f, cols in emb.feature_slices().items():
            torch.testing.assert_close(out[:, cols], theirs[f], rtol=1e-6, atol=1e-6, msg=lambda m: f"{f}: {m}")
        # the same upstream gradient on each feature's columns; TorchRec: plain SGD on its weights
        their_grad = torch.cat([g[:, emb.feature_slices()[f]] for f in theirs.keys()], dim=1)
        ebc.zero_grad()
        theirs.values().backward(their_grad)
        with torch.no_grad():
            for t in emb.tables:
                w = ebc.embedding_bags[t.name].weight
                w -= lr * w.grad
        out.backward(g)                                          # Neo: the fused update in backward
        for t in emb.tables:
            torch.testing.assert_close(emb.table_weight(t.name), ebc.embedding_bags[t.name].weight.detach(),
                                       rtol=1e-6, atol=1e-6, msg=lambda m: f"step {step} table {t.name}: {m}")


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_weighted_variable_batches_pool_like_embedding_bag_on_the_full_batch(backend):
    emb = TableBatchedEmbedding(_tables(0.1), backend=backend, seed=5)
    kjt, full, full_w = _random_vbe(7, weighted=True)
    out = emb(kjt)
    for f, cols in emb.feature_slices().items():
        t = next(t for t in emb.tables if f in t.feature_names)
        flat = [i for bag in full[f] for i in bag]
        offsets = torch.tensor([0] + [len(b) for b in full[f]][:-1]).cumsum(0)
        bag = nn.EmbeddingBag.from_pretrained(emb.table_weight(t.name).detach(), mode="sum")
        want = bag(torch.tensor(flat, dtype=torch.int64), offsets,
                   per_sample_weights=torch.tensor([w for ws in full_w[f] for w in ws]))
        if t.pooling.value == "mean":
            want = want / torch.tensor([max(len(b), 1) for b in full[f]]).unsqueeze(1)
        torch.testing.assert_close(out[:, cols], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{f}: {m}")
    with pytest.raises(ValueError, match="pooled_bags is not supported with a variable-batch"):
        emb(kjt, pooled_bags=torch.ones(18, dtype=torch.bool))


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_unpooled_lookups_return_each_features_own_bags_as_torchrecs_embedding_collection(backend):
    """TorchRec's EmbeddingCollection on a VBE KJT returns feature f's B_f bags (no expansion)."""
    emb = TableBatchedEmbedding(_tables(0.1), backend=backend, seed=6)
    for seed in range(3):
        kjt, bags, _ = _random_vbe(20 + seed, max_bags=9, own=True)
        got = emb.sequence(kjt)
        for f, seq in got.items():
            t = next(t for t in emb.tables if f in t.feature_names)
            assert seq.lengths.tolist() == [len(b) for b in bags[f]], f
            want = emb.table_weight(t.name)[torch.tensor([i for b in bags[f] for i in b], dtype=torch.int64)]
            assert torch.equal(seq.values, want), f


def test_bad_variable_batches_are_named():
    kjt, _, _ = _random_vbe(1)
    no_inverse = KJT(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                     stride_per_key_per_rank=kjt.stride_per_key_per_rank())
    emb = TableBatchedEmbedding(_tables(0.1), backend="reference")
    with pytest.raises(ValueError, match="variable-batch KeyedJaggedTensor .* needs its inverse_indices"):
        emb(no_inverse)
    inv_keys, inv = kjt.inverse_indices()
    missing = KJT(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                  stride_per_key_per_rank=kjt.stride_per_key_per_rank(), inverse_indices=(inv_keys[:2], inv[:2]))
    with pytest.raises(ValueError, match="feature 'a': not in the KeyedJaggedTensor's inverse_indices"):
        emb(missing)
    far = inv.clone()
    far[inv_keys.index("b"), 4] = kjt.stride_per_key()[1]     # one past b's bags
    outside = KJT(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                  stride_per_key_per_rank=kjt.stride_per_key_per_rank(), inverse_indices=(inv_keys, far))
    with pytest.raises(ValueError, match=rf"feature 'b': inverse_indices\[1, 4\] = {kjt.stride_per_key()[1]} "
                                         rf"is outside its {kjt.stride_per_key()[1]} bags"):
        emb(outside)
    lengths = kjt.lengths().clone()
    lengths[kjt.stride_per_key()[0] + 1] = -1                 # feature b's bag 1
    negative = KJT(keys=kjt.keys(), values=kjt.values(), lengths=lengths,
                   stride_per_key_per_rank=kjt.stride_per_key_per_rank(), inverse_indices=(inv_keys, inv))
    with pytest.raises(ValueError, match="feature 'b': bag 1 of a variable-batch KeyedJaggedTensor has the negative"):
        emb(negative)
    assert emb.table_weight("t0").isfinite().all()            # nothing looked up, nothing changed


# ----------------------------------------------------------------------------- sharded, W = 2
W = 2
TYPES = {"t0": "row_wise", "t1": "table_wise"}


def _sharded_worker(rank: int, world_size: int) -> dict:
    from neo.distributed import ProcessGroups, ShardedEmbeddingCollection
    from tests.distributed.distributed_cases import Case

    pg = ProcessGroups.build(W, timeout=datetime.timedelta(seconds=60))
    tables = _tables(0.1)
    plan = Case("vbe", tables, TYPES, W, W).plan()
    init = TableBatchedEmbedding(tables, backend="reference", seed=4)
    vbe, plain = (ShardedEmbeddingCollection(tables, plan, pg) for _ in range(2))
    for sec in (vbe, plain):
        sec.load_full_weights({t.name: init.table_weight(t.name) for t in tables})
    kjt, _, _ = _random_vbe(200 + rank, max_bags=6 + 3 * rank)    # rank 1: up to 9 bags a feature, B 6
    g = torch.randn(6, 16, generator=torch.Generator().manual_seed(300 + rank))
    out = vbe(kjt)
    out.backward(g)
    ref = plain(expand_variable_batch(kjt))
    ref.backward(g)
    seq = {f: (s.values.detach().clone(), s.lengths.clone()) for f, s in vbe.sequence(kjt).items()}
    return {"out": out.detach(), "ref": ref.detach(), "weights": vbe.full_weights(), "ref_weights": plain.full_weights(),
            "slices": vbe.feature_slices(), "sequence": seq, "after": vbe.full_weights()}


def test_a_sharded_collection_takes_each_ranks_variable_batch():
    got = run_multiprocess(_sharded_worker, W)
    init = TableBatchedEmbedding(_tables(0.1), backend="reference", seed=4)
    table_of = {f: t for t in init.tables for f in t.feature_names}
    for rank, out in enumerate(got):
        _, full, _ = _random_vbe(200 + rank, max_bags=6 + 3 * rank)
        _, bags, _ = _random_vbe(200 + rank, max_bags=6 + 3 * rank, own=True)
        for f, (values, lengths) in out["sequence"].items():          # each feature's own bags, unpooled
            t = table_of[f]
            assert lengths.tolist() == [len(b) for b in bags[f]], (rank, f)
            ids = torch.tensor([i for b in bags[f] for i in b], dtype=torch.int64)
            assert torch.equal(values, out["after"][t.name][ids]), (rank, f)
        batch = KeyedJaggedBatch.from_lists(full)
        for f, cols in out["slices"].items():
            t = table_of[f]
            values, lengths, _ = batch.feature(f)
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
            bag = nn.EmbeddingBag.from_pretrained(init.table_weight(t.name).detach(), mode=t.pooling.value)
            torch.testing.assert_close(out["out"][:, cols], bag(values, offsets), rtol=1e-6, atol=1e-6,
                                       msg=lambda m: f"rank {rank} feature {f}: {m}")
        assert torch.equal(out["out"], out["ref"])
        for name, w in out["ref_weights"].items():
            torch.testing.assert_close(out["weights"][name], w, rtol=1e-6, atol=1e-7)
            assert not torch.equal(w, init.table_weight(name).detach()), name
