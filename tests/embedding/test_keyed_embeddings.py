"""``TableBatchedEmbedding.keyed`` / ``neo.sparse.KeyedEmbeddings`` (TorchRec's ``KeyedTensor``).

Oracles: ``torch.nn.EmbeddingBag`` per feature (its table's weights) for each feature's
columns; ``torch.cat`` of the ``to_dict()`` pieces for ``regroup``; and for gradients, a
twin module trained by the full output's backward with the same gradient placed in the
regrouped features' columns (zero elsewhere). Tables in two groups, so that the module's
output order (table order) differs from its kernels' (group order).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedEmbeddings, regroup

from harness import random_batch

SGD, ADA = OptimizerConfig("sgd", lr=0.3), OptimizerConfig("adagrad", lr=0.2)
TABLES = [TableConfig("a", num_rows=9, dim=4, feature_names=("fa",), optimizer=SGD),
          TableConfig("b", num_rows=7, dim=8, feature_names=("fb1", "fb2"), optimizer=ADA, pooling="mean"),
          TableConfig("c", num_rows=5, dim=12, feature_names=("fc",), optimizer=SGD)]
GROUPS = [["fc", "fa"], ["fb2"], ["fb1", "fb2", "fc"]]


def _embedding_bag(emb: TableBatchedEmbedding, feature: str, batch) -> torch.Tensor:
    table = next(t for t in TABLES if feature in t.feature_names)
    bag = nn.EmbeddingBag.from_pretrained(emb.table_weight(table.name).clone(), mode=table.pooling.value)
    values, lengths, _ = batch.feature(feature)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    return bag(values, offsets)


def test_columns_of_each_feature_are_its_embedding_bag():
    emb = TableBatchedEmbedding(TABLES, backend="reference", seed=1)
    assert emb._group_order != emb.feature_names          # the case where the kernels' order differs
    batch = random_batch(TABLES, 5, torch.Generator().manual_seed(0))
    kt = emb.keyed(batch)
    assert kt.keys() == ["fa", "fb1", "fb2", "fc"] and kt.length_per_key() == [4, 8, 8, 12]
    assert kt.offset_per_key() == [0, 4, 12, 20, 32]
    assert emb.feature_slices() == {"fa": slice(0, 4), "fb1": slice(4, 12), "fb2": slice(12, 20), "fc": slice(20, 32)}
    for f, piece in kt.to_dict().items():
        torch.testing.assert_close(piece, _embedding_bag(emb, f, batch), rtol=1e-6, atol=1e-6, msg=f)
        assert piece.data_ptr() == kt.values()[:, emb.feature_slices()[f]].data_ptr()      # a view
    pieces = kt.to_dict()
    for group, got in zip(GROUPS, kt.regroup(GROUPS)):
        assert torch.equal(got, torch.cat([pieces[f] for f in group], dim=1)), group


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: "+".join(g))
def test_a_loss_on_a_regrouped_piece_trains_the_rows_the_full_output_would(group):
    gen = torch.Generator().manual_seed(3)
    a, b = (TableBatchedEmbedding(TABLES, backend="reference", seed=4) for _ in range(2))
    batch = random_batch(TABLES, 6, gen)
    width = sum(t.dim for t in TABLES for f in t.feature_names if f in group)
    g = torch.randn(6, width, generator=gen)
    (a.keyed(batch).regroup([group])[0] * g).sum().backward()

    full = b(batch)
    grad, c = torch.zeros_like(full), 0
    for f in group:
        cols = b.feature_slices()[f]
        grad[:, cols] += g[:, c:c + cols.stop - cols.start]
        c += cols.stop - cols.start
    full.backward(grad)
    moved = False
    for t in TABLES:
        torch.testing.assert_close(a.table_weight(t.name), b.table_weight(t.name), rtol=1e-6, atol=1e-7, msg=t.name)
        moved |= not torch.equal(a.table_weight(t.name), TableBatchedEmbedding(TABLES, backend="reference",
                                                                                seed=4).table_weight(t.name))
    assert moved


def test_regroup_across_two_modules_and_errors():
    emb1 = TableBatchedEmbedding(TABLES[:1], backend="reference")
    emb2 = TableBatchedEmbedding(TABLES[1:], backend="reference")
    gen = torch.Generator().manual_seed(5)
    k1, k2 = emb1.keyed(random_batch(TABLES[:1], 3, gen)), emb2.keyed(random_batch(TABLES[1:], 3, gen))
    got, = regroup([k1, k2], [["fb2", "fa"]])
    assert torch.equal(got, torch.cat([k2["fb2"], k1["fa"]], dim=1))
    with pytest.raises(KeyError, match="no feature 'nope'"):
        regroup([k1, k2], [["nope"]])
    with pytest.raises(ValueError, match="'fa' is in two"):
        regroup([k1, k1], [["fa"]])
    with pytest.raises(ValueError, match=r"values must be \(B, 12\)"):
        KeyedEmbeddings(["x", "y"], [4, 8], torch.zeros(2, 10))
    with pytest.raises(ValueError, match="repeat"):
        KeyedEmbeddings(["x", "x"], [4, 8], torch.zeros(2, 12))
