"""The fbgemm backend (FBGEMM's CPU TBE aliasing Neo's buffers) against the reference."""

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch

from harness import run_steps

import fbgemm_gpu  # noqa: E402,F401


OPTS = [OptimizerConfig("sgd", lr=0.1), OptimizerConfig("adagrad", lr=0.1), OptimizerConfig("rowwise_adagrad", lr=0.1)]


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
