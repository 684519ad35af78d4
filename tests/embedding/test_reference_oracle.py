"""The reference backend against independent oracles.

Forward: ``torch.nn.functional.embedding_bag`` per feature. Fused updates: ``torch.optim``
(SGD, Adagrad, Adam) on the equivalent dense problem, and dense re-statements of
row-wise Adagrad and LAMB. Every batch touches every row, so that dense optimizers (which
also move rows with zero gradient under weight decay or momentum) and the sparse update
must agree exactly; sparse-only semantics are covered by the backend-vs-reference tests.
"""

import pytest
import torch
import torch.nn.functional as F

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch

from harness import assert_pooled_close, random_batch, summation_slack


def tables_for(opt: OptimizerConfig, pooling: str = "sum"):
    return [
        TableConfig("t0", num_rows=7, dim=4, feature_names=("f0", "f1"), pooling=pooling, optimizer=opt),
        TableConfig("t1", num_rows=5, dim=12, pooling=pooling, optimizer=opt),
        TableConfig("t2", num_rows=3, dim=8, feature_names=("f2",), pooling=pooling, optimizer=opt),
    ]


def covering_batch(tables, batch_size, gen, weighted):
    """random_batch, plus every row of every table appended to bag 0 of the table's first feature."""
    b = random_batch(tables, batch_size, gen, weighted=weighted)
    bags = b.to_dict()
    for t in tables:
        bags[t.feature_names[0]][0] += list(range(t.num_rows))
    weights = None
    if weighted:
        weights = {k: [[float(x) for x in torch.rand(len(bag), generator=gen) + 0.5] for bag in v] for k, v in bags.items()}
    return KeyedJaggedBatch.from_lists(bags, weights=weights)


def dense_forward(tables, params, batch, pooling):
    outs = []
    for t in tables:
        for f in t.feature_names:
            values, lengths, w = batch.feature(f)
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
            if pooling == "mean" and w is not None:      # embedding_bag has no weighted mean: do it by hand
                pooled = F.embedding_bag(values, params[t.name], offsets, mode="sum", per_sample_weights=w)
                outs.append(pooled / lengths.clamp(min=1).unsqueeze(1))
            else:
                outs.append(F.embedding_bag(values, params[t.name], offsets, mode=pooling, per_sample_weights=w))
    return torch.cat(outs, dim=1)


def dense_rowwise_adagrad(params, state, opt):
    for name, p in params.items():
        g = p.grad + opt.weight_decay * p.detach()
        state[name] += (g * g).mean(dim=1)
        p.data -= (opt.lr / (state[name].sqrt() + opt.eps)).unsqueeze(1) * g


def dense_lamb(params, state, opt, step):
    for name, p in params.items():
        g = p.grad
        m, v = state[name]
        m.mul_(opt.beta1).add_((1 - opt.beta1) * g)
        v.mul_(opt.beta2).add_((1 - opt.beta2) * g * g)
        u = (m / (1 - opt.beta1 ** step)) / ((v / (1 - opt.beta2 ** step)).sqrt() + opt.eps) + opt.weight_decay * p.detach()
        ratio = p.detach().norm(dim=1, keepdim=True) / u.norm(dim=1, keepdim=True)
        p.data -= opt.lr * ratio * u


CASES = [
    OptimizerConfig("sgd", lr=0.1),
    OptimizerConfig("sgd", lr=0.1, weight_decay=0.01),
    OptimizerConfig("adagrad", lr=0.1, eps=1e-8),
    OptimizerConfig("adagrad", lr=0.1, weight_decay=0.05, initial_accumulator_value=0.1),
    OptimizerConfig("rowwise_adagrad", lr=0.1, weight_decay=0.01),
    OptimizerConfig("adam", lr=0.01, beta1=0.8, beta2=0.95, eps=1e-6),
    OptimizerConfig("adam", lr=0.01, weight_decay=0.02),
    OptimizerConfig("lamb", lr=0.01, weight_decay=0.01),
]


class DenseOracle:
    """The equivalent dense problem: a ``torch.nn.Parameter`` per table (the module's initial
    weights) and ``torch.optim`` (SGD, Adagrad, Adam), or the dense re-statements of row-wise
    Adagrad and LAMB above."""

    def __init__(self, tables, opt: OptimizerConfig, emb: TableBatchedEmbedding):
        self.tables, self.opt, self.kind = tables, opt, opt.type.value
        self.params = {t.name: torch.nn.Parameter(emb.table_weight(t.name).clone()) for t in tables}
        values = self.params.values()
        self.torch_opt = None
        if self.kind == "sgd":
            self.torch_opt = torch.optim.SGD(values, lr=opt.lr, weight_decay=opt.weight_decay)
        elif self.kind == "adagrad":
            self.torch_opt = torch.optim.Adagrad(values, lr=opt.lr, eps=opt.eps, weight_decay=opt.weight_decay,
                                                 initial_accumulator_value=opt.initial_accumulator_value)
        elif self.kind == "adam":
            self.torch_opt = torch.optim.Adam(values, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps,
                                              weight_decay=opt.weight_decay)
        self.state = {t.name: torch.zeros(t.num_rows) for t in tables} if self.kind == "rowwise_adagrad" else \
            {t.name: (torch.zeros(t.num_rows, t.dim), torch.zeros(t.num_rows, t.dim)) for t in tables}

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def step(self, step: int) -> None:
        if self.kind == "rowwise_adagrad":
            dense_rowwise_adagrad(self.params, self.state, self.opt)
        elif self.kind == "lamb":
            dense_lamb(self.params, self.state, self.opt, step)
        else:
            self.torch_opt.step()

    def assert_matches(self, emb: TableBatchedEmbedding, what: str) -> None:
        for t in self.tables:
            torch.testing.assert_close(emb.table_weight(t.name), self.params[t.name].detach(), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{what} table {t.name}: {m}")


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("opt", CASES, ids=lambda o: f"{o.type.value}-wd{o.weight_decay}")
def test_fused_update_matches_dense_torch_optim(opt, weighted, pooling):
    tables = tables_for(opt, pooling)
    emb = TableBatchedEmbedding(tables, backend="reference", seed=3)
    oracle = DenseOracle(tables, opt, emb)
    kind = opt.type.value
    gen = torch.Generator().manual_seed(11)
    for step in range(1, 4):
        batch = covering_batch(tables, 6, gen, weighted)
        out = emb(batch)
        expected = dense_forward(tables, oracle.params, batch, pooling)
        # the two sum each bag in their own order, from weights that differ after the first step by
        # what the updates' rounding left (checked below): a bag whose terms cancel moves by more than
        # 1e-6 (seed shift 511: 1.17e-6 on a pooled 0.008), within that bound
        assert_pooled_close(out.detach(), expected.detach(), summation_slack(emb, batch, oracle.params), 1e-5, 1e-6,
                            f"{kind} step {step} forward")
        grad = torch.randn(out.shape, generator=gen)
        out.backward(grad)
        oracle.zero_grad()
        expected.backward(grad)
        oracle.step(step)
        oracle.assert_matches(emb, f"{kind} step {step}")
    if kind == "adagrad":
        for t in tables:
            torch.testing.assert_close(emb.table_optimizer_state(t.name)["sum"],
                                       oracle.torch_opt.state[oracle.params[t.name]]["sum"])
    if kind == "adam":
        for t in tables:
            st = oracle.torch_opt.state[oracle.params[t.name]]
            torch.testing.assert_close(emb.table_optimizer_state(t.name)["exp_avg_sq"], st["exp_avg_sq"])


def test_sparse_update_leaves_untouched_rows_alone():
    """Adam with weight decay: a row absent from the batch keeps its weight and state."""
    tables = [TableConfig("t", 10, 4, optimizer=OptimizerConfig("adam", lr=0.1, weight_decay=0.1))]
    emb = TableBatchedEmbedding(tables, backend="reference")
    before = emb.table_weight("t").clone()
    emb(KeyedJaggedBatch.from_lists({"t": [[1, 1, 2]]})).sum().backward()
    emb(KeyedJaggedBatch.from_lists({"t": [[2]]})).sum().backward()
    after = emb.table_weight("t")
    untouched = [0, 3, 4, 5, 6, 7, 8, 9]
    assert torch.equal(after[untouched], before[untouched])
    assert not torch.equal(after[1], before[1]) and not torch.equal(after[2], before[2])
    state = emb.table_optimizer_state("t")
    assert torch.count_nonzero(state["exp_avg"][untouched]) == 0
    assert emb.optimizer_steps() == {"t": 2}
