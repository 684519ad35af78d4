"""PositionWeights (TorchRec's PositionWeightedModuleCollection) before a TableBatchedEmbedding.

The oracle is plain PyTorch: each id's position in its bag counted by a Python loop, the weights
``w_f[position]`` gathered from a copy of the parameters, ``F.embedding_bag(...,
per_sample_weights=...)`` over a copy of the tables, differentiated by autograd. The module's
parameters must get the same gradient through Neo's lookup (its weight-gradient kernel) and the
lookup the same output. Each test runs both paths of the module: ``neo._C``'s loops (eager, CPU)
and the torch operations (a GPU, tracing, ``torch.func``); and the two against each other. The
sharded case: tests/distributed/test_sharded_weight_grad.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import EmbeddingInputError, PositionWeights, TableBatchedEmbedding
from neo.embedding import position_weights as pw_module
from neo.sparse import KeyedJaggedBatch

TABLES = [TableConfig("a", 30, 8, feature_names=("a1", "a2"), optimizer=OptimizerConfig("sgd", lr=0.1)),
          TableConfig("b", 17, 4, pooling="mean", optimizer=OptimizerConfig("sgd", lr=0.1))]
B = 6


def _batch(weights: bool = False, seed: int = 0) -> KeyedJaggedBatch:
    gen = torch.Generator().manual_seed(seed)
    keys = ("a1", "a2", "b")
    lengths = torch.randint(0, 6, (len(keys) * B,), generator=gen)
    rows = {"a1": 30, "a2": 30, "b": 17}
    values = torch.cat([torch.randint(0, rows[k], (int(lengths[i * B:(i + 1) * B].sum()),), generator=gen)
                        for i, k in enumerate(keys)])
    w = torch.rand(values.numel(), generator=gen) + 0.5 if weights else None
    return KeyedJaggedBatch(keys, values, lengths, B, weights=w)


@pytest.fixture(params=["kernels", "torch"])
def path(request, monkeypatch):
    """The module's path: neo._C's loops (which must be built), or torch operations throughout."""
    if request.param == "kernels":
        assert pw_module._kernels(torch.zeros(1)) is not None, "neo._C lacks the position-weights loops"
    else:
        monkeypatch.setattr(pw_module, "_kernels", lambda t: None)
    return request.param


def _positions(batch: KeyedJaggedBatch) -> list:
    """(feature, position) of every id, by counting: the oracle's own."""
    out = []
    for k, f in enumerate(batch.keys):
        for b in range(B):
            out.extend((f, p) for p in range(int(batch.lengths[k * B + b])))
    return out


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_gradient_of_position_weights_matches_plain_pytorch(backend, path):
    torch.manual_seed(0)
    pw = PositionWeights({"a1": 5, "b": 7})
    with torch.no_grad():
        for p in pw.parameters():
            p.uniform_(0.5, 1.5)
    emb = TableBatchedEmbedding(TABLES, backend=backend, seed=1)
    tables = {t.name: emb.table_weight(t.name).detach().clone() for t in TABLES}
    batch = _batch(weights=True)
    grad = torch.randn(B, emb.output_dim)
    out = emb(pw(batch))
    out.backward(grad)

    ref = {f: p.detach().clone().requires_grad_() for f, p in pw.weights.items()}
    pos = _positions(batch)
    w = torch.stack([ref[f][p] if f in ref else batch.weights[i] for i, (f, p) in enumerate(pos)])
    cols, loss, table_of = emb.feature_slices(), torch.zeros(()), {"a1": "a", "a2": "a", "b": "b"}
    pooled_ref = []
    for k, f in enumerate(batch.keys):
        off = batch.offsets[k * B:(k + 1) * B + 1]
        bags = F.embedding_bag(batch.values[off[0]:off[-1]], tables[table_of[f]], off[:-1] - off[0], mode="sum",
                               per_sample_weights=w[off[0]:off[-1]])
        if f == "b":
            bags = bags / (off[1:] - off[:-1]).clamp(min=1).unsqueeze(1)
        pooled_ref.append(bags)
        loss = loss + (bags * grad[:, cols[f]]).sum()
    loss.backward()
    torch.testing.assert_close(out.detach(), torch.cat(pooled_ref, 1), rtol=1e-5, atol=1e-6)
    for f, p in pw.weights.items():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), f
        torch.testing.assert_close(p.grad, ref[f].grad, rtol=1e-5, atol=1e-6, msg=f"feature {f}")


def test_weights_by_position_and_the_other_features_kept(path):
    pw = PositionWeights({"a2": 6})
    with torch.no_grad():
        pw.weights["a2"].copy_(torch.arange(6, dtype=torch.float32) + 1)
    for weighted in (False, True):
        batch = _batch(weights=weighted, seed=3)
        got = pw(batch).weights.detach()
        for i, (f, p) in enumerate(_positions(batch)):
            want = float(p + 1) if f == "a2" else (float(batch.weights[i]) if weighted else 1.0)
            assert float(got[i]) == want, (weighted, i, f, p)
    assert [n for n, _ in pw.named_parameters()] == ["weights.a2"]


def test_bad_input_names_the_feature(path):
    batch = _batch(seed=5)
    longest = int(batch.lengths[:B].max())
    with pytest.raises(EmbeddingInputError, match=rf"feature 'a1': sample \d+ has a bag of {longest} ids, "
                                                   rf"longer than its max_length {longest - 1}"):
        PositionWeights({"a1": longest - 1})(batch)
    PositionWeights({"a1": longest})(batch)                                     # exactly the longest: fine
    with pytest.raises(EmbeddingInputError, match="feature 'zz' is not in the batch"):
        PositionWeights({"zz": 3})(batch)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"max_lengths\['a1'\] must be an integer >= 1"):
            PositionWeights({"a1": bad})
    with pytest.raises(ValueError, match="names no feature"):
        PositionWeights({})


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pw = PositionWeights({"a2": 5, "b": 6})
        self.emb = TableBatchedEmbedding(TABLES, backend="cpu", seed=2)

    def forward(self, batch: KeyedJaggedBatch) -> torch.Tensor:
        return self.emb(self.pw(batch))


@pytest.mark.parametrize("weighted", [False, True])
def test_an_exported_model_with_position_weights_runs_as_eager(weighted):
    """``neo.export`` traces the module (no read of the batch in Python): the program gives eager
    mode's numbers bit for bit at other batch sizes, 1 included."""
    import neo.export

    m = _Model().eval()
    with torch.no_grad():
        for p in m.pw.parameters():
            p.uniform_(0.5, 1.5)
    program = neo.export.export(m, (_batch(weighted, seed=0),))
    for seed, size in [(1, B), (2, 1), (3, 13)]:
        gen = torch.Generator().manual_seed(seed)
        lengths = torch.randint(0, 6, (3 * size,), generator=gen)
        values = torch.randint(0, 17, (int(lengths.sum()),), generator=gen)
        w = torch.rand(values.numel(), generator=gen) + 0.5 if weighted else None
        batch = KeyedJaggedBatch(("a1", "a2", "b"), values, lengths, size, weights=w)
        with torch.no_grad():
            want = m(batch)
        assert torch.equal(program.module()(batch), want), (seed, size)


def test_torch_func_grad_of_the_weights_is_autograds(path):
    """Under ``torch.func.grad`` (functional_call over the parameters: the torch operations) the
    table's read gives the gradient ``.backward()`` gives (the same bits through the torch
    operations; through neo._C's loops, which sum in double, within rounding), and a plain-torch
    read's."""
    from torch.func import functional_call, grad

    pw = PositionWeights({"a1": 5, "b": 6})
    with torch.no_grad():
        for p in pw.parameters():
            p.uniform_(0.5, 1.5)
    batch = _batch(seed=4)
    scale = torch.linspace(-1.0, 2.0, batch.values.numel())

    def loss(params):
        return (functional_call(pw, params, (batch,)).weights * scale).sum()

    got = grad(loss)(dict(pw.named_parameters()))
    (pw(batch).weights * scale).sum().backward()
    plain = {n: p.detach().clone().requires_grad_() for n, p in pw.named_parameters()}
    table = torch.cat([plain["weights.a1"], plain["weights.b"], torch.ones(1)])
    (table[pw.table_index(batch)] * scale).sum().backward()
    for n, p in pw.named_parameters():
        assert bool(p.grad.abs().sum() > 0), n
        if path == "torch":
            assert torch.equal(got[n], p.grad), n
        torch.testing.assert_close(got[n], p.grad, rtol=1e-6, atol=1e-6, msg=n)
        torch.testing.assert_close(p.grad, plain[n].grad, rtol=1e-6, atol=1e-6, msg=n)


def test_kernels_equal_torch_operations(monkeypatch):
    """neo._C's slots and weights are the torch operations' to the bit, the gradient within
    rounding, on bags of 0 to 40 ids (some longer than a feature's table: the error), features
    not named, the batch's own weights."""
    gen = torch.Generator().manual_seed(7)
    keys, Bn = ("u", "v", "w", "x"), 33
    lengths = torch.randint(0, 41, (len(keys) * Bn,), generator=gen)
    values = torch.randint(0, 100, (int(lengths.sum()),), generator=gen)
    pw = PositionWeights({"u": 40, "w": 41, "x": 40})
    with torch.no_grad():
        for p in pw.parameters():
            p.uniform_(0.5, 1.5, generator=gen)
    scale = torch.randn(values.numel(), generator=gen)
    for own in (None, torch.rand(values.numel(), generator=gen)):
        batch = KeyedJaggedBatch(keys, values, lengths, Bn, weights=own)
        got = {}
        for kernels in (True, False):
            if not kernels:
                monkeypatch.setattr(pw_module, "_kernels", lambda t: None)
            pw.zero_grad()
            slots = pw.table_index(batch)
            weights = pw(batch).weights
            (weights * scale).sum().backward()
            got[kernels] = (slots, weights.detach(), [p.grad.clone() for p in pw.parameters()])
        monkeypatch.undo()
        assert torch.equal(got[True][0], got[False][0])
        assert torch.equal(got[True][1], got[False][1])
        for a, b in zip(got[True][2], got[False][2]):
            assert bool(a.abs().sum() > 0)
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)
    long_bag = int(lengths.view(len(keys), Bn)[0].argmax())
    lengths[long_bag] = 41
    batch = KeyedJaggedBatch(keys, torch.randint(0, 100, (int(lengths.sum()),), generator=gen), lengths, Bn)
    messages = []
    for kernels in (True, False):
        if not kernels:
            monkeypatch.setattr(pw_module, "_kernels", lambda t: None)
        with pytest.raises(EmbeddingInputError) as err:
            pw(batch)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and f"feature 'u': sample {long_bag} has a bag of 41 ids" in messages[0]


def test_kernels_refuse_bad_slots_and_offsets():
    """neo._C's loops raise, naming the id and slot or the offsets, instead of reading out of
    bounds (slots arrive from other ranks under sharding)."""
    from neo.cpp import cpu_kernels

    _C = cpu_kernels("position_read")
    assert _C is not None
    parts = [torch.ones(3), torch.ones(2)]
    with pytest.raises(RuntimeError, match="id 1's slot 6 is outside the table's 6 slots"):
        _C.position_read(parts, torch.tensor([0, 6, 1]))
    with pytest.raises(RuntimeError, match="id 0's slot -1 is outside"):
        _C.position_read_backward(torch.ones(1), torch.tensor([-1]), [3, 2])
    first, limits = torch.tensor([0, 3]), torch.tensor([3, 2])
    with pytest.raises(RuntimeError, match="offsets run from 0 to 4, the batch holds 5 ids"):
        _C.position_slots(torch.tensor([0, 1, 2, 4]), torch.tensor([0]), torch.tensor([3]), 5, 3, 5)
    with pytest.raises(RuntimeError, match="offsets decrease at bag 1"):
        _C.position_slots(torch.tensor([0, 3, 2, 4, 4]), first, limits, 5, 2, 4)
    slots, bad = _C.position_slots(torch.tensor([0, 3, 3, 4, 7]), first, limits, 5, 2, 7)
    assert slots.tolist() == [0, 1, 2, 3, 3, 4, 5] and bad == 3          # bag 3: 3 ids, limit 2
