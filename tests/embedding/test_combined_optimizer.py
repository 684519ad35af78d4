"""``neo.optim.CombinedOptimizer``: a dense optimizer and a module's fused optimizer zeroed,
stepped, scheduled and saved as one. Oracle: ``torch.optim`` over the equivalent dense problem
(a parameter per table) with one group per optimizer group, under the same scheduler."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from neo.config.embedding import OptimizerConfig
from neo.embedding import TableBatchedEmbedding
from neo.optim import CombinedOptimizer
from test_reference_oracle import covering_batch, dense_forward, tables_for


def _model(seed: int = 7):
    tables = tables_for(OptimizerConfig("sgd", lr=0.1))
    emb = TableBatchedEmbedding(tables, backend="reference", seed=seed)
    torch.manual_seed(0)
    head = torch.nn.Linear(emb.output_dim, 1)
    return tables, emb, head


def _run(emb, head, opt, sched, steps, gen):
    for _ in range(steps):
        batch = covering_batch(emb.tables, 6, gen, weighted=False)
        y = torch.randn(6, 1, generator=gen)
        opt.zero_grad()
        F.mse_loss(head(emb(batch)), y).backward()
        opt.step()
        sched.step()


def test_one_scheduler_over_both_equals_torch_optim_on_the_dense_problem():
    tables, emb, head = _model()
    ref_head = copy.deepcopy(head)
    params = {t.name: torch.nn.Parameter(emb.table_weight(t.name).clone()) for t in tables}
    opt = CombinedOptimizer([("dense", torch.optim.SGD(head.parameters(), lr=0.05)), ("sparse", emb.fused_optimizer)])
    assert len(opt.param_groups) == 1 + len(emb.fused_optimizer.param_groups)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    ref_opt = torch.optim.SGD([{"params": ref_head.parameters(), "lr": 0.05},
                               {"params": list(params.values()), "lr": 0.1}])
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.1)
    gen = torch.Generator().manual_seed(4)
    for step in range(5):
        batch = covering_batch(tables, 6, gen, weighted=False)
        y = torch.randn(6, 1, generator=gen)
        opt.zero_grad()
        F.mse_loss(head(emb(batch)), y).backward()
        opt.step()
        sched.step()
        ref_opt.zero_grad()
        F.mse_loss(ref_head(dense_forward(tables, params, batch, "sum")), y).backward()
        ref_opt.step()
        ref_sched.step()
        assert emb.learning_rates == [ref_opt.param_groups[1]["lr"]] * len(emb.learning_rates), step
        for t in tables:
            torch.testing.assert_close(emb.table_weight(t.name), params[t.name].detach(), rtol=1e-5, atol=1e-6)
        for a, b in zip(head.parameters(), ref_head.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _combined(emb, head):
    opt = CombinedOptimizer([("dense", torch.optim.Adam(head.parameters(), lr=0.01)), ("sparse", emb.fused_optimizer)])
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)


def test_state_dict_resumes_both_optimizers_and_the_schedule():
    _, emb, head = _model()
    opt, sched = _combined(emb, head)
    _run(emb, head, opt, sched, 4, torch.Generator().manual_seed(5))
    full = [emb.table_weight(t.name).clone() for t in emb.tables], [p.detach().clone() for p in head.parameters()]

    _, emb2, head2 = _model()
    opt2, sched2 = _combined(emb2, head2)
    gen = torch.Generator().manual_seed(5)
    _run(emb2, head2, opt2, sched2, 2, gen)
    saved = copy.deepcopy((opt2.state_dict(), sched2.state_dict(), emb2.state_dict(), head2.state_dict()))
    _, emb3, head3 = _model(seed=99)
    opt3, sched3 = _combined(emb3, head3)
    emb3.load_state_dict(saved[2])
    head3.load_state_dict(saved[3])
    opt3.load_state_dict(saved[0])
    sched3.load_state_dict(saved[1])
    _run(emb3, head3, opt3, sched3, 2, gen)
    for a, b in zip(full[0], [emb3.table_weight(t.name) for t in emb3.tables]):
        assert torch.equal(a, b)
    for a, b in zip(full[1], head3.parameters()):
        assert torch.equal(a, b)


def test_bad_uses_are_named():
    _, emb, head = _model()
    dense = torch.optim.SGD(head.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"optimizers\[1\] is a list, not a torch\.optim\.Optimizer"):
        CombinedOptimizer([dense, [emb.fused_optimizer]])
    with pytest.raises(ValueError, match="the name 'a' is given twice"):
        CombinedOptimizer([("a", dense), ("a", emb.fused_optimizer)])
    with pytest.raises(ValueError, match=r"optimizers\[1\] \('1'\) is given twice"):
        CombinedOptimizer([dense, dense])
    opt = CombinedOptimizer([("dense", dense), ("sparse", emb.fused_optimizer)])
    with pytest.raises(TypeError, match="add the group to one of its optimizers"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    before = copy.deepcopy(dense.state_dict())
    with pytest.raises(ValueError, match=r"saved optimizers \['dense'\], these are \['dense', 'sparse'\]"):
        opt.load_state_dict({"optimizers": {"dense": before}})
    assert dense.state_dict() == before
    clone = copy.deepcopy(opt)                         # deep-copied with its model, e.g. for EMA or a checkpoint
    assert list(clone.optimizers) == ["dense", "sparse"] and len(clone.param_groups) == len(opt.param_groups)
    assert repr(opt) == "CombinedOptimizer(dense: SGD, sparse: FusedOptimizer)"


def test_state_dict_hooks_run_as_on_any_torch_optimizer():
    _, emb, head = _model()
    opt = CombinedOptimizer([("dense", torch.optim.SGD(head.parameters(), lr=0.1)), ("sparse", emb.fused_optimizer)])
    calls = []
    opt.register_state_dict_pre_hook(lambda o: calls.append("save pre"))
    opt.register_state_dict_post_hook(lambda o, sd: calls.append("save post"))
    opt.register_load_state_dict_pre_hook(lambda o, sd: calls.append("load pre"))
    opt.register_load_state_dict_post_hook(lambda o: calls.append("load post"))
    saved = opt.state_dict()
    saved["optimizers"]["dense"]["param_groups"][0]["lr"] = 0.25

    def changed(o, sd):                                  # a pre-load hook may hand back another state dict
        out = copy.deepcopy(sd)
        out["optimizers"]["dense"]["param_groups"][0]["lr"] = 0.5
        return out

    opt.register_load_state_dict_pre_hook(changed)
    opt.load_state_dict(saved)
    assert calls == ["save pre", "save post", "load pre", "load post"]
    assert opt.optimizers["dense"].param_groups[0]["lr"] == 0.5


def test_the_fused_optimizer_runs_state_dict_hooks_too():
    _, emb, _ = _model()
    fused = emb.fused_optimizer
    calls = []
    fused.register_state_dict_pre_hook(lambda o: calls.append("save pre"))
    fused.register_state_dict_post_hook(lambda o, sd: calls.append("save post"))
    fused.register_load_state_dict_pre_hook(lambda o, sd: calls.append("load pre"))
    fused.register_load_state_dict_post_hook(lambda o: calls.append("load post"))
    fused.load_state_dict(fused.state_dict())
    assert calls == ["save pre", "save post", "load pre", "load post"]


def test_a_load_one_optimizer_refuses_loads_nothing():
    """The sparse part of another module's tables is refused after the dense part would have
    loaded: the dense optimizer keeps its own state (all or nothing; audit of 2026-11-30)."""
    _, emb, head = _model()
    dense = torch.optim.SGD(head.parameters(), lr=0.1)
    opt = CombinedOptimizer([("dense", dense), ("sparse", emb.fused_optimizer)])
    saved = opt.state_dict()
    saved["optimizers"]["dense"]["param_groups"][0]["lr"] = 0.9
    saved["optimizers"]["sparse"]["param_groups"][0]["tables"] = ["another"]
    with pytest.raises(ValueError, match="FusedOptimizer.load_state_dict: the saved groups' tables"):
        opt.load_state_dict(saved)
    assert dense.param_groups[0]["lr"] == 0.1


def test_a_dense_part_that_does_not_fit_leaves_the_fused_groups_as_they_were():
    """The other order: the fused optimizer first, then a dense part of other parameter groups.
    Every part is checked before any loads: the fused groups get no saved key (an initial_lr a
    scheduler would take as its base), and no save hook runs during the load (review of 2026-11-30)."""
    _, emb, head = _model()
    fused = emb.fused_optimizer
    opt = CombinedOptimizer([("sparse", fused), ("dense", torch.optim.SGD(head.parameters(), lr=0.1))])
    saved = copy.deepcopy(opt.state_dict())
    for g in saved["optimizers"]["sparse"]["param_groups"]:
        g.update(lr=0.5, initial_lr=123.0)
    saved["optimizers"]["dense"]["param_groups"][0]["params"] = []
    before = [dict(g) for g in fused.param_groups]
    saves = []
    fused.register_state_dict_post_hook(lambda o, sd: saves.append(1))
    with pytest.raises(ValueError, match=r"optimizer 'dense': the saved parameter groups do not match"):
        opt.load_state_dict(saved)
    assert [dict(g) for g in fused.param_groups] == before and not saves
