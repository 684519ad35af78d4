"""``torch.export`` of a whole DLRM, its tables included (``neo.export``), for inference.

Before, the export failed in torch's words: a KeyedJaggedBatch was not a pytree node, and the
lookup's Python read the offsets of fake tensors. Now the batch is a pytree node and each lookup
one custom op (neo/embedding/exported.py), and the traced MLPs do eager mode's arithmetic (the
product, then bias and ReLU). The oracle: the same model in eager mode, bit for bit,
at batch sizes other than the example's (1 included), after a save and a load in a fresh process
too; bad batches raise the errors eager mode raises.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import neo.export
from neo.config.embedding import Placement, PoolingMode, TableConfig, WeightDType
from neo.embedding import EmbeddingInputError, TableBatchedEmbedding
from neo.models import DLRM
from neo.sparse import JaggedValidationError, KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

D = 8
# group order differs from table order (fp16 and mean-pooled tables group apart): the output permuted
TABLES = [
    TableConfig("t0", 50, D),
    TableConfig("t1", 40, D, dtype=WeightDType.FP16),
    TableConfig("t2", 30, D, pooling=PoolingMode.MEAN),
    TableConfig("t3", 60, D, feature_names=("f3", "f4")),     # two features, one table
]
KEYS = ("t0", "t1", "t2", "f3", "f4")
F = len(KEYS)


def model(interaction: str = "dot", tables=TABLES) -> DLRM:
    torch.manual_seed(0)
    # layers wide enough that addmm (the bias inside the GEMM) rounds otherwise than eager's product
    # then bias and ReLU: the traced MLP must do what eager mode does
    m = DLRM(TableBatchedEmbedding(tables, backend="cpu", seed=3), F, D, 13, [512, 256, D], [512, 256, 1],
             interaction=interaction)
    return m.eval()


def batch(B: int, seed: int, weighted: bool = False, keys=KEYS):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * B,), generator=gen)
    ids = torch.randint(0, 30, (int(lengths.sum()),), generator=gen)
    w = torch.rand(ids.numel(), generator=gen) + 0.5 if weighted else None
    return torch.randn(B, 13, generator=gen), KeyedJaggedBatch(keys, ids, lengths, B, weights=w)


def eager(m: DLRM, args) -> torch.Tensor:
    with torch.no_grad():
        return m(*args)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_an_exported_dlrm_runs_as_eager_at_any_batch_size(interaction, weighted):
    m = model(interaction)
    program = neo.export.export(m, batch(8, 0, weighted))
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "neo.pooled_lookup.default" in ops
    for B, seed in [(8, 1), (1, 2), (37, 3)]:
        args = batch(B, seed, weighted)
        out = program.module()(*args)
        assert out.shape == (B,) and torch.equal(out, eager(m, args))


def test_a_saved_program_loads_and_runs_in_another_process(tmp_path):
    m = model()
    torch.export.save(neo.export.export(m, batch(8, 0)), tmp_path / "dlrm.pt2")
    args = batch(11, 4)
    torch.save({"args": args, "expected": eager(m, args)}, tmp_path / "io.pt")
    script = (f"import torch, neo.export\n"
              f"torch.set_num_threads({torch.get_num_threads()})\n"      # the GEMMs' sums follow the threads
              f"program = torch.export.load({str(tmp_path / 'dlrm.pt2')!r})\n"
              f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
              f"assert torch.equal(program.module()(*io['args']), io['expected'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "weights_only" not in done.stderr        # the example batch loads as a safe global


def test_the_program_checks_its_batches_as_eager_mode():
    m = model()
    program = neo.export.export(m, batch(8, 0)).module()
    dense, kjt = batch(4, 5)
    values = kjt.values.clone()
    values[int(kjt.offsets[3 * 4])] = 60                   # first id of feature f3: table t3 has 60 rows
    bad = KeyedJaggedBatch(KEYS, values, kjt.lengths, 4)
    for run in (program, m):
        with pytest.raises(EmbeddingInputError, match="feature 'f3' \\(table 't3'\\): id 60"):
            run(dense, bad)
    offsets = kjt.offsets.clone()
    offsets[2] += 1                                        # disagrees with the lengths
    malformed = KeyedJaggedBatch(KEYS, kjt.values, kjt.lengths, 4, offsets=offsets, validate=False)
    with pytest.raises(JaggedValidationError, match="feature 't0'"):
        program(dense, malformed)


def test_exports_that_cannot_serve_are_refused_naming_why():
    m = model().train()
    with pytest.raises(RuntimeError, match="call model.eval"):
        neo.export.export(m, batch(8, 0))
    with pytest.raises(RuntimeError, match="call model.eval"):         # torch.export directly
        torch.export.export(m, batch(8, 0), dynamic_shapes=neo.export.dynamic_shapes(batch(8, 0)))
    cached = [TableConfig(t.name, t.num_rows, D, feature_names=t.feature_names, pooling=t.pooling, dtype=t.dtype,
                          placement=Placement.CACHED if t.name == "t0" else Placement.DEVICE,
                          cache_rows=16 if t.name == "t0" else None, cache_store="host") for t in TABLES]
    with pytest.raises(NotImplementedError, match=r"cached tables \(t0\)"):
        neo.export.export(model(tables=cached), batch(8, 0))


def test_the_batch_is_a_pytree_node():
    _, kjt = batch(3, 6, weighted=True)
    leaves, spec = torch.utils._pytree.tree_flatten(kjt)
    assert [tuple(x.shape) for x in leaves] == [tuple(kjt.values.shape), (F, 3), (F * 3 + 1,), tuple(kjt.values.shape)]
    back = torch.utils._pytree.tree_unflatten(leaves, spec)
    assert back.keys == KEYS and back.batch_size == 3
    for name in ("values", "lengths", "offsets", "weights"):
        assert torch.equal(getattr(back, name), getattr(kjt, name))


def _export_sharded(rank: int, world_size: int):
    from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan

    pg = ProcessGroups.build()
    tables = [TableConfig(f"t{i}", 20, D) for i in range(2)]
    sec = ShardedEmbeddingCollection(tables, even_plan(tables, {"t0": "table_wise", "t1": "row_wise"}, 1, 1), pg)
    m = DLRM(sec, 2, D, 13, [16, D], [16, 1]).eval()
    try:
        neo.export.export(m, batch(4, 0, keys=("t0", "t1")))
    except NotImplementedError as e:
        return str(e)


def test_a_sharded_collection_is_refused_naming_the_way_out():
    (message,) = run_multiprocess(_export_sharded, 1)
    assert "unsharded TableBatchedEmbedding" in message and "full_weights()" in message
