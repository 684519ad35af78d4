"""Unpooled (sequence) lookups, neo/embedding/sequence.py, against independent oracles: the rows
``weight[ids]`` (``torch.nn.functional.embedding``) forward, and ``torch.optim`` (or the dense
re-statements of row-wise Adagrad and LAMB) on the equivalent dense problem for the fused
update, on the reference and cpu backends; a table read by two features (its rows get their
summed gradient and one step); the shared step count; the errors."""

import pytest
import torch
import torch.nn.functional as F

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import EmbeddingInputError, SequenceEmbedding, TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch

from harness import random_batch
from test_cache import assert_same_tables, make_batch as cache_batch, make_tables as cache_tables
from test_reference_oracle import CASES, DenseOracle, covering_batch, tables_for

BACKENDS = ["reference", "cpu"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_id_gets_its_row(backend):
    tables = tables_for(OptimizerConfig("sgd", lr=0.1))
    emb = TableBatchedEmbedding(tables, backend=backend, seed=5)
    gen = torch.Generator().manual_seed(2)
    batch = random_batch(tables, 9, gen)
    with torch.no_grad():
        got = emb.sequence(batch)
    assert list(got) == list(batch.keys)
    for f, seq in got.items():
        ids, lengths, _ = batch.feature(f)
        table = emb.feature_table[f]
        assert torch.equal(seq.lengths, lengths)
        assert torch.equal(seq.values, F.embedding(ids.to(torch.int64), emb.table_weight(table))), f


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", CASES, ids=lambda o: f"{o.type.value}-wd{o.weight_decay}")
def test_fused_update_matches_dense_torch_optim(backend, opt):
    """Three steps; every batch touches every row (dense optimizers move rows without gradient
    under weight decay); table t0 is read by features f0 and f1, with ids repeated."""
    tables = tables_for(opt)
    emb = TableBatchedEmbedding(tables, backend=backend, seed=3)
    oracle = DenseOracle(tables, opt, emb)
    gen = torch.Generator().manual_seed(11)
    for step in range(1, 4):
        batch = covering_batch(tables, 6, gen, weighted=False)
        got = emb.sequence(batch)
        loss, dense_loss = 0.0, 0.0
        for f, seq in got.items():
            ids = batch.feature(f)[0].to(torch.int64)
            expected = F.embedding(ids, oracle.params[emb.feature_table[f]])
            torch.testing.assert_close(seq.values, expected.detach(), rtol=1e-5, atol=1e-6)   # earlier steps' rounding
            coeff = torch.randn(seq.values.shape, generator=gen)
            loss = loss + (seq.values * coeff).sum()
            dense_loss = dense_loss + (expected * coeff).sum()
        loss.backward()
        oracle.zero_grad()
        dense_loss.backward()
        oracle.step(step)
        oracle.assert_matches(emb, f"{backend} {opt.type.value} step {step}")
    assert emb.optimizer_steps() == {t.name: 3 for t in tables}      # one step a lookup, not one a table


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", [OptimizerConfig("adam", lr=0.01, beta1=0.8, beta2=0.95, eps=1e-6),
                                 OptimizerConfig("lamb", lr=0.01, weight_decay=0.01)], ids=lambda o: o.type.value)
def test_two_lookups_then_their_backwards_take_steps_one_and_two(backend, opt):
    """Two sequence lookups before either backward: their updates are steps 1 and 2 (Adam's bias
    correction, LAMB's), in backward order, as two lookups one after the other and as the dense
    problem under torch.optim with the gradients of the weights each forward read."""
    tables = tables_for(opt)
    emb = TableBatchedEmbedding(tables, backend=backend, seed=3)
    oracle = DenseOracle(tables, opt, emb)
    gen = torch.Generator().manual_seed(12)
    batches = [covering_batch(tables, 6, gen, weighted=False) for _ in range(2)]
    losses, dense_losses = [], []
    for batch in batches:                                  # both forwards first
        got = emb.sequence(batch)
        loss, dense_loss = 0.0, 0.0
        for f, seq in got.items():
            ids = batch.feature(f)[0].to(torch.int64)
            coeff = torch.randn(seq.values.shape, generator=gen)
            loss = loss + (seq.values * coeff).sum()
            dense_loss = dense_loss + (F.embedding(ids, oracle.params[emb.feature_table[f]]) * coeff).sum()
        losses.append(loss)
        dense_losses.append(dense_loss)
    for step, (loss, dense_loss) in enumerate(zip(losses, dense_losses), start=1):   # linear: grads do not depend on the weights
        loss.backward()
        oracle.zero_grad()
        dense_loss.backward()
        oracle.step(step)
        oracle.assert_matches(emb, f"{backend} {opt.type.value} step {step}")
    assert emb.optimizer_steps() == {t.name: 2 for t in tables}


@pytest.mark.parametrize("backend", BACKENDS)
def test_pooled_and_unpooled_updates_agree_on_bags_of_one(backend):
    """A batch whose every bag holds one id: the sequence lookup is the pooled one (sum), and the
    same gradients give the same update."""
    tables = tables_for(OptimizerConfig("adam", lr=0.01))
    a = TableBatchedEmbedding(tables, backend=backend, seed=1)
    b = TableBatchedEmbedding(tables, backend=backend, seed=1)
    gen = torch.Generator().manual_seed(4)
    for _ in range(2):
        bags = {f: [[int(torch.randint(0, t.num_rows, (1,), generator=gen))] for _ in range(5)]
                for t in tables for f in t.feature_names}
        batch = KeyedJaggedBatch.from_lists(bags)
        pooled = a(batch)
        seq = b.sequence(batch)
        torch.testing.assert_close(torch.cat([seq[f].values for f in batch.keys], dim=1), pooled.detach(),
                                   rtol=0, atol=0)
        grad = torch.randn(pooled.shape, generator=gen)
        pooled.backward(grad)
        cols = torch.split(grad, [s.values.shape[1] for s in seq.values()], dim=1)
        sum((s.values * g).sum() for s, g in zip(seq.values(), cols)).backward()
        for t in tables:
            assert torch.equal(a.table_weight(t.name), b.table_weight(t.name)), t.name


def test_padded_view_and_offsets():
    values = torch.arange(12, dtype=torch.float32).view(6, 2)
    seq = SequenceEmbedding(values, torch.tensor([2, 0, 3, 1]))
    assert seq.offsets.tolist() == [0, 2, 2, 5, 6]
    padded = seq.to_padded()
    assert padded.shape == (4, 3, 2)
    assert torch.equal(padded[0, :2], values[0:2]) and not padded[0, 2].any()
    assert not padded[1].any()
    assert torch.equal(padded[2], values[2:5]) and torch.equal(padded[3, 0], values[5])
    assert torch.equal(seq.to_padded(2)[2], values[2:4])                  # truncated to 2


def test_errors_name_what_is_wrong(tmp_path):
    tables = [TableConfig("t", num_rows=4, dim=4, feature_names=("a",))]
    emb = TableBatchedEmbedding(tables, backend="reference")
    with pytest.raises(EmbeddingInputError, match=r"feature 'a'.*table 't'|table 't'.*feature 'a'"):
        emb.sequence(KeyedJaggedBatch.from_lists({"a": [[1, 4]]}))                   # id 4 of 4 rows
    with pytest.raises(EmbeddingInputError, match="take no per-sample weights"):
        emb.sequence(KeyedJaggedBatch.from_lists({"a": [[1]]}, weights={"a": [[2.0]]}))
    with pytest.raises(EmbeddingInputError, match=r"read by no table"):
        emb.sequence(KeyedJaggedBatch.from_lists({"a": [[1]], "b": [[0]]}))
    emb.backend_name = "fbgemm"                                           # as with fbgemm_gpu installed
    with pytest.raises(EmbeddingInputError, match=r"run on the \['reference', 'cpu', 'triton'\] backends, not 'fbgemm'"):
        emb.sequence(KeyedJaggedBatch.from_lists({"a": [[1]]}))
    cached = TableBatchedEmbedding([TableConfig("c", num_rows=40, dim=4, placement="cached", cache_rows=8)],
                                   backend="reference", store_dir=str(tmp_path))
    with pytest.raises(EmbeddingInputError, match=r"feature 'c'.*id 40"):       # named before anything moves
        cached.sequence(KeyedJaggedBatch.from_lists({"c": [[1, 40]]}))
    assert cached.cache_stats()["c"].misses == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_invalid_ids_are_zero_rows_and_update_nothing(backend):
    tables = [TableConfig("t", num_rows=4, dim=4, optimizer=OptimizerConfig("sgd", lr=1.0))]
    emb = TableBatchedEmbedding(tables, backend=backend, validate=False)
    before = emb.table_weight("t").clone()
    batch = KeyedJaggedBatch(("t",), torch.tensor([1, 7, -1]), torch.tensor([2, 1]), 2, validate=False)
    seq = emb.sequence(batch)["t"]
    assert torch.equal(seq.values[0], before[1]) and not seq.values[1:].any()
    seq.values.sum().backward()
    after = emb.table_weight("t")
    assert torch.equal(after[[0, 2, 3]], before[[0, 2, 3]]) and not torch.equal(after[1], before[1])
    assert emb.skipped_ids == {"t": 2}              # counted once per invalid id, as pooled lookups count
    with torch.no_grad():
        emb.sequence(batch)                         # without autograd too
    emb(batch)                                      # the pooled lookup adds its own
    assert emb.skipped_ids == {"t": 6}
    emb.sequence(KeyedJaggedBatch.from_lists({"t": [[0, 3], [2]]}))
    assert emb.skipped_ids == {"t": 6}              # good input adds nothing


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_invalid_ids_are_counted_per_table(backend, tmp_path):
    """validate=False: a table read by two features, a table of another group and a cached table
    (whose invalid ids become slot -1), the batch's keys in another order than the module's:
    every invalid id counted once, under its table; the rows and updates are those of the same
    batch with the invalid ids removed."""
    tables = [TableConfig("t", num_rows=6, dim=4, feature_names=("a", "b")),
              TableConfig("u", num_rows=5, dim=8, optimizer=OptimizerConfig("adagrad", lr=0.5)),
              TableConfig("c", num_rows=40, dim=4, placement="cached", cache_rows=8)]
    loose = TableBatchedEmbedding(tables, backend=backend, validate=False, seed=3, store_dir=str(tmp_path / "l"))
    clean = TableBatchedEmbedding(tables, backend=backend, seed=3, store_dir=str(tmp_path / "c"))
    bad = KeyedJaggedBatch.from_lists({"c": [[1, 40, 2], [-3]], "u": [[4, 5], [0, -1, 7]],
                                       "b": [[6], [2, 1]], "a": [[0, -6], [5]]})
    good = KeyedJaggedBatch.from_lists({"c": [[1, 2], []], "u": [[4], [0]], "b": [[], [2, 1]], "a": [[0], [5]]})
    got, want = loose.sequence(bad), clean.sequence(good)
    for f in bad.keys:
        ids = bad.feature(f)[0]
        valid = (ids >= 0) & (ids < {"a": 6, "b": 6, "u": 5, "c": 40}[f])
        assert torch.equal(got[f].values[valid], want[f].values) and not got[f].values[~valid].any(), f
    for seq in (got, want):
        sum((s.values ** 2).sum() for s in seq.values()).backward()
    assert loose.skipped_ids == {"t": 2, "u": 3, "c": 2}
    for t in tables:
        assert torch.equal(loose.table_weight(t.name), clean.table_weight(t.name)), t.name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", ["adagrad", "adam"])
def test_cached_tables_train_as_tables_in_memory(backend, opt):
    """Caches smaller than the tables' touched rows (evictions and write-backs every few steps),
    prefetched every other step: the same rows, and after ten steps the same tables and state
    (bit for bit) as the module that holds every row; steps whose loss reads only the uncached
    feature still release the batch from the cache's flight."""
    dev = TableBatchedEmbedding(cache_tables(opt, False), backend=backend, seed=3)
    cached = TableBatchedEmbedding(cache_tables(opt, True), backend=backend, seed=3)
    gen = torch.Generator().manual_seed(11)
    batches = [cache_batch(gen) for _ in range(12)]
    for i, b in enumerate(batches[:10]):
        if i % 2 == 0:
            cached.prefetch(b, future=batches[i + 1:i + 3])
        seq_dev, seq_cached = dev.sequence(b), cached.sequence(b)
        used = ["dev"] if i == 3 else list(b.keys)
        loss = {}
        for name, seq in (("dev", seq_dev), ("cached", seq_cached)):
            g = torch.Generator().manual_seed(100 + i)
            loss[name] = sum((seq[f].values * torch.randn(seq[f].values.shape, generator=g)).sum() for f in used)
        for f in b.keys:
            assert torch.equal(seq_dev[f].values, seq_cached[f].values), f"step {i} feature {f}"
        loss["dev"].backward()
        loss["cached"].backward()
        assert cached._cache.in_flight == 0, f"step {i}: the batch is still in the cache's flight"
    with torch.no_grad():
        assert torch.equal(dev.sequence(batches[10])["big1"].values, cached.sequence(batches[10])["big1"].values)
    assert cached._cache.in_flight == 0
    assert_same_tables(dev, cached)
    stats = cached.cache_stats()["big"]
    assert stats.misses > 0 and stats.evictions > 0 and stats.writebacks > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_invalid_id_is_named_and_nothing_moves(backend):
    """On the cpu backend the kernel counts invalid ids as it looks up (no separate pass over the
    ids); either way the error names feature, table and id, and no table changes."""
    tables = [TableConfig("t", num_rows=6, dim=4, feature_names=("a", "b")), TableConfig("u", num_rows=5, dim=4)]
    emb = TableBatchedEmbedding(tables, backend=backend, seed=1)
    before = {t.name: emb.table_weight(t.name).clone() for t in tables}
    bad = KeyedJaggedBatch.from_lists({"a": [[1, 2]], "b": [[0]], "u": [[4, 5]]})
    with pytest.raises(EmbeddingInputError, match=r"feature 'u' \(table 'u'\): id 5 at sample 0 is out of range"):
        emb.sequence(bad)
    with torch.no_grad(), pytest.raises(EmbeddingInputError, match=r"feature 'u'.*id 5"):
        emb.sequence(bad)
    for t in tables:
        assert torch.equal(emb.table_weight(t.name), before[t.name]), t.name
    good = KeyedJaggedBatch.from_lists({"a": [[1, 2]], "b": [[0]], "u": [[4, 0]]})
    sum(s.values.sum() for s in emb.sequence(good).values()).backward()     # still trains
    assert not torch.equal(emb.table_weight("u"), before["u"])


def test_rows_and_jagged_tensors_equal_torchrecs_embedding_collection():
    """Against TorchRec's (unsharded, CPU) EmbeddingCollection holding the same weights: per feature
    the same JaggedTensor (values, lengths, offsets); a table read by two features included."""
    import torchrec  # an optional peer of Neo, always installed by the test setup (tools/setup.sh --dev)
    from torchrec import EmbeddingCollection, EmbeddingConfig

    tables = [TableConfig("t", num_rows=30, dim=8, feature_names=("a", "b")), TableConfig("u", num_rows=20, dim=8)]
    emb = TableBatchedEmbedding(tables, backend="cpu", seed=4)
    ec = EmbeddingCollection(tables=[EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                                                     feature_names=list(t.feature_names)) for t in tables])
    with torch.no_grad():
        for t in tables:
            ec.embeddings[t.name].weight.copy_(emb.table_weight(t.name))
    batch = KeyedJaggedBatch.from_lists({"a": [[1, 2, 29], [], [5]], "b": [[0], [7, 7], []], "u": [[3], [19, 0], [4]]})
    want = ec(batch.to_torchrec())
    with torch.no_grad():
        got = {f: s.to_torchrec() for f, s in emb.sequence(batch).items()}
    assert set(got) == set(want)
    for f, jt in want.items():
        assert isinstance(got[f], torchrec.JaggedTensor)
        assert torch.equal(got[f].values(), jt.values()), f
        assert torch.equal(got[f].lengths(), jt.lengths()) and torch.equal(got[f].offsets(), jt.offsets()), f
