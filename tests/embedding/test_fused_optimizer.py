"""``TableBatchedEmbedding.fused_optimizer``: torch LR schedulers drive the fused update.

Oracle: the dense problem (a ``torch.nn.Parameter`` per table, ``F.embedding_bag`` forward,
``torch.optim`` SGD / Adagrad / Adam: ``DenseOracle`` of test_reference_oracle.py) under the
SAME scheduler, on the same batches and output gradients: weights after every step and the lr
of every step agree. The loop orders differ on purpose (zero_grad first, zero_grad last, none):
the fused update happens in backward, before ``step()``, so the lr a scheduler sets must reach
the kernels before the next backward whatever the order.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.embedding.fused_optimizer import FusedOptimizer
from test_reference_oracle import DenseOracle, covering_batch, dense_forward, tables_for

SCHEDULERS = {
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
    # lambda(0) != 1: the scheduler's constructor already changes the lr of step 0
    "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.3 + 0.6 * e),
}


def _lrs(opt: torch.optim.Optimizer):
    return [g["lr"] for g in opt.param_groups]


def test_one_param_group_per_fused_group_holding_the_tables_weights():
    sgd, ada = OptimizerConfig("sgd", lr=0.1), OptimizerConfig("adagrad", lr=0.2)
    ts = [TableConfig("a", num_rows=5, dim=4, optimizer=sgd), TableConfig("b", num_rows=6, dim=8, optimizer=ada),
          TableConfig("c", num_rows=7, dim=4, feature_names=("c1", "c2"), optimizer=sgd)]
    emb = TableBatchedEmbedding(ts, backend="reference")
    opt = emb.fused_optimizer
    assert isinstance(opt, torch.optim.Optimizer) and opt is emb.fused_optimizer      # one object: schedulers keep it
    assert [(g["tables"], g["lr"]) for g in opt.param_groups] == [(["a", "c"], 0.1), (["b"], 0.2)]
    for g in opt.param_groups:
        assert [p.data_ptr() for p in g["params"]] == [emb.table_weight(t).data_ptr() for t in g["tables"]]
        assert [tuple(p.shape) for p in g["params"]] == [tuple(emb.table_weight(t).shape) for t in g["tables"]]
    assert opt.state_dict() == {"state": {}, "param_groups": [{"lr": 0.1, "tables": ["a", "c"]},
                                                              {"lr": 0.2, "tables": ["b"]}]}


@pytest.mark.parametrize("order", ["zero_grad first", "zero_grad last", "no zero_grad"])
@pytest.mark.parametrize("sched", sorted(SCHEDULERS))
@pytest.mark.parametrize("opt_cfg", [OptimizerConfig("sgd", lr=0.1), OptimizerConfig("adagrad", lr=0.1),
                                     OptimizerConfig("adam", lr=0.01)], ids=lambda o: o.type.value)
def test_a_scheduler_drives_the_fused_update_as_it_drives_torch_optim(opt_cfg, sched, order):
    tables = tables_for(opt_cfg)
    emb = TableBatchedEmbedding(tables, backend="reference", seed=3)
    oracle = DenseOracle(tables, opt_cfg, emb)
    fused = emb.fused_optimizer
    ours, theirs = SCHEDULERS[sched](fused), SCHEDULERS[sched](oracle.torch_opt)
    gen = torch.Generator().manual_seed(11)
    for step in range(1, 4):
        assert _lrs(fused) == _lrs(oracle.torch_opt), f"step {step}"
        assert emb.learning_rates == _lrs(fused), f"step {step}: the kernels' lr is not the group's"
        batch = covering_batch(tables, 6, gen, weighted=False)
        grad = torch.randn(6, emb.output_dim, generator=gen)
        if order == "zero_grad first":
            fused.zero_grad()
        emb(batch).backward(grad)
        fused.step()
        if order == "zero_grad last":
            fused.zero_grad()
        ours.step()
        oracle.zero_grad()
        dense_forward(tables, oracle.params, batch, "sum").backward(grad)
        oracle.step(step)
        theirs.step()
        oracle.assert_matches(emb, f"{sched} / {order}, step {step}")
    assert emb.learning_rates != [opt_cfg.lr]            # the schedule did change it


def test_two_groups_each_on_its_own_schedule():
    """Two optimizer configs: two groups, each with its lambda (LambdaLR takes one per group),
    against one torch.optim.SGD with the same two param groups."""
    slow, fast = OptimizerConfig("sgd", lr=0.05), OptimizerConfig("sgd", lr=0.2, weight_decay=0.01)
    tables = [TableConfig("t0", num_rows=7, dim=4, feature_names=("f0", "f1"), optimizer=slow),
              TableConfig("t1", num_rows=5, dim=12, optimizer=fast),
              TableConfig("t2", num_rows=3, dim=8, feature_names=("f2",), optimizer=slow)]
    emb = TableBatchedEmbedding(tables, backend="reference", seed=5)
    params = {t.name: torch.nn.Parameter(emb.table_weight(t.name).clone()) for t in tables}
    torch_opt = torch.optim.SGD([{"params": [params["t0"], params["t2"]], "lr": 0.05},
                                 {"params": [params["t1"]], "lr": 0.2, "weight_decay": 0.01}])
    lambdas = [lambda e: 0.5 ** e, lambda e: 1.0 + e]
    ours = torch.optim.lr_scheduler.LambdaLR(emb.fused_optimizer, lambdas)
    theirs = torch.optim.lr_scheduler.LambdaLR(torch_opt, lambdas)
    assert [g["tables"] for g in emb.fused_optimizer.param_groups] == [["t0", "t2"], ["t1"]]
    gen = torch.Generator().manual_seed(2)
    for step in range(3):
        batch = covering_batch(tables, 5, gen, weighted=True)
        grad = torch.randn(5, emb.output_dim, generator=gen)
        emb(batch).backward(grad)
        emb.fused_optimizer.step()
        ours.step()
        torch_opt.zero_grad()
        dense_forward(tables, params, batch, "sum").backward(grad)
        torch_opt.step()
        theirs.step()
        for t in tables:
            torch.testing.assert_close(emb.table_weight(t.name), params[t.name].detach(), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"step {step} table {t.name}: {m}")
    assert emb.learning_rates == [0.05 * 0.5 ** 3, 0.2 * 4.0]


def test_stepped_next_to_a_dense_optimizer():
    """``[dense_opt, emb.fused_optimizer]`` zeroed and stepped together, one scheduler each."""
    opt_cfg = OptimizerConfig("sgd", lr=0.1)
    tables = tables_for(opt_cfg)
    emb = TableBatchedEmbedding(tables, backend="reference", seed=7)
    torch.manual_seed(0)
    head = torch.nn.Linear(emb.output_dim, 1)
    ref_head = copy.deepcopy(head)
    params = {t.name: torch.nn.Parameter(emb.table_weight(t.name).clone()) for t in tables}
    opts = [torch.optim.SGD(head.parameters(), lr=0.05), emb.fused_optimizer]
    ref_opt = torch.optim.SGD([{"params": ref_head.parameters(), "lr": 0.05},
                               {"params": list(params.values()), "lr": 0.1}])
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.1) for o in opts]
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.1)
    gen = torch.Generator().manual_seed(4)
    for step in range(4):
        batch = covering_batch(tables, 6, gen, weighted=False)
        y = torch.randn(6, 1, generator=gen)
        for o in opts:
            o.zero_grad()
        F.mse_loss(head(emb(batch)), y).backward()
        for o in opts:
            o.step()
        for s in scheds:
            s.step()
        ref_opt.zero_grad()
        F.mse_loss(ref_head(dense_forward(tables, params, batch, "sum")), y).backward()
        ref_opt.step()
        ref_sched.step()
        for t in tables:
            torch.testing.assert_close(emb.table_weight(t.name), params[t.name].detach(), rtol=1e-5, atol=1e-6)
        for a, b in zip(head.parameters(), ref_head.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_state_dict_carries_the_lrs_and_resumes_a_schedule():
    opt_cfg = OptimizerConfig("adagrad", lr=0.1)
    emb = TableBatchedEmbedding(tables_for(opt_cfg), backend="reference")
    sched = torch.optim.lr_scheduler.StepLR(emb.fused_optimizer, step_size=1, gamma=0.5)
    for _ in range(3):
        emb.fused_optimizer.step()
        sched.step()
    saved, saved_sched = copy.deepcopy(emb.fused_optimizer.state_dict()), sched.state_dict()
    assert saved == {"state": {}, "param_groups": [{"lr": 0.0125, "initial_lr": 0.1, "tables": ["t0", "t1", "t2"]}]}

    other = TableBatchedEmbedding(tables_for(opt_cfg), backend="reference")
    resumed = torch.optim.lr_scheduler.StepLR(other.fused_optimizer, step_size=1, gamma=0.5)
    other.fused_optimizer.load_state_dict(saved)
    resumed.load_state_dict(saved_sched)
    assert other.learning_rates == [0.0125]                               # on the kernels at once
    # the same resumption of a torch optimizer: the lrs go on alike
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sgd_sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    for _ in range(3):
        sgd.step()
        sgd_sched.step()
    for _ in range(2):
        other.fused_optimizer.step()
        resumed.step()
        sgd.step()
        sgd_sched.step()
        assert other.learning_rates == _lrs(sgd) == _lrs(other.fused_optimizer)
    assert other.learning_rates == [0.003125]

    two_groups = TableBatchedEmbedding([TableConfig("t0", num_rows=3, dim=4, optimizer=opt_cfg),
                                        TableConfig("t1", num_rows=3, dim=4)], backend="reference")
    before = list(two_groups.learning_rates)
    with pytest.raises(ValueError, match=r"\('t0', 't1', 't2'\).*\('t0',\).*\('t1',\)"):
        two_groups.fused_optimizer.load_state_dict(saved)
    assert two_groups.learning_rates == before


def test_refusals_leave_the_kernels_as_they_were():
    emb = TableBatchedEmbedding(tables_for(OptimizerConfig("sgd", lr=0.1)), backend="reference")
    opt = emb.fused_optimizer
    with pytest.raises(ValueError, match="finite number >= 0"):
        opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="finite number >= 0"):
        opt.param_groups[0]["lr"] = float("nan")
    assert emb.learning_rates == [0.1] and opt.param_groups[0]["lr"] == 0.1
    with pytest.raises(TypeError, match="cannot be added"):
        opt.add_param_group({"params": [torch.zeros(1)], "lr": 0.1})
    with pytest.raises(ValueError, match="fixed"):
        opt.param_groups[0]["tables"] = ["t0"]


def test_set_learning_rates_drives_the_kernels_and_the_groups_alike():
    """The trainer's schedule (``set_learning_rates`` every step) works as before, fused
    optimizer made or not, and the groups follow it: their next step() keeps that rate, a
    scheduler's next value replaces it, and a deep copy of the module (EMA, SWA) works."""
    import copy

    emb = TableBatchedEmbedding(tables_for(OptimizerConfig("sgd", lr=0.1)), backend="reference")
    opt = emb.fused_optimizer
    emb.set_learning_rates({"t0": 0.03, "t1": 0.03, "t2": 0.03})
    assert emb.learning_rates == [0.03] and opt.param_groups[0]["lr"] == 0.03
    opt.step()
    assert emb.learning_rates == [0.03]
    opt.param_groups[0]["lr"] = 0.2
    assert emb.learning_rates == [0.2]
    twin = copy.deepcopy(emb)
    assert twin.fused_optimizer.param_groups[0]["lr"] == 0.2 and twin.learning_rates == [0.2]
    twin.fused_optimizer.param_groups[0]["lr"] = 0.5
    assert twin.learning_rates == [0.5] and emb.learning_rates == [0.2]


def test_step_applies_the_lr_before_its_closure_runs():
    emb = TableBatchedEmbedding(tables_for(OptimizerConfig("sgd", lr=0.1)), backend="reference")
    opt = emb.fused_optimizer
    dict.__setitem__(opt.param_groups[0], "lr", 0.02)           # past the group's hook: the kernels still at 0.1
    assert emb.learning_rates == [0.1]
    seen = []
    assert opt.step(lambda: seen.append(list(emb.learning_rates)) or 1.5) == 1.5
    assert seen == [[0.02]] and isinstance(opt, FusedOptimizer)
