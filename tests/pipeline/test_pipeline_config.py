"""The ``parallel.pipeline`` section, the placement of stages and samples, and Chimera's order.

No process group: config validation (errors name the field), :class:`PipelineMesh` (pure data)
and :func:`chimera_order` (a list schedule checked against its dependencies).
"""

from __future__ import annotations

import os

import pytest

from neo.config import ConfigError, config_from_dict, load_config
from neo.config.parallel import PipelineConfig
from neo.pipeline.chimera import Op, chimera_order
from neo.pipeline.mesh import DOWN, UP, PipelineMesh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cfg(**kw) -> PipelineConfig:
    c = PipelineConfig(**kw)
    c.validate()
    return c


def test_section_loads_from_yaml_and_defaults_to_no_pipeline():
    cfg = config_from_dict({"parallel": {"pipeline": {"stages": 2, "schedule": "Zero_Bubble", "micro_batches": 8,
                                                      "split": [[0, 3], [4, 9]]}}})
    p = cfg.parallel.pipeline
    assert (p.stages, p.schedule, p.micro_batches, p.split, p.enabled) == (2, "zero_bubble", 8, [[0, 3], [4, 9]], True)
    assert not config_from_dict({}).parallel.pipeline.enabled
    with pytest.raises(ConfigError, match=r"parallel\.pipeline\.stage: unknown key"):
        config_from_dict({"parallel": {"pipeline": {"stage": 2}}})


@pytest.mark.parametrize("kw,match", [
    ({"schedule": "pipedream"}, r"parallel\.pipeline\.schedule: 'pipedream' is not one of .*'gpipe'.*'chimera'.*'auto'"),
    ({"stages": 0}, r"parallel\.pipeline\.stages: must be a positive integer"),
    ({"micro_batches": 0}, r"parallel\.pipeline\.micro_batches: must be a positive integer"),
    ({"schedule": "interleaved_1f1b", "virtual_stages": 1}, r"parallel\.pipeline\.virtual_stages: .*interleaved_1f1b needs 2"),
    ({"schedule": "1f1b", "virtual_stages": 2}, r"parallel\.pipeline\.virtual_stages: schedule 1f1b runs one"),
    ({"schedule": "chimera", "stages": 3}, r"parallel\.pipeline\.stages: .*chimera.*even number of stages, got 3"),
    ({"schedule": "chimera", "stages": 2, "micro_batches": 3}, r"parallel\.pipeline\.micro_batches: .*even number"),
    ({"stages": 2, "split": [[0, 3]]}, r"parallel\.pipeline\.split: give one \[first, last\] pair per model chunk .* 2\), got 1"),
    ({"stages": 2, "split": [[0, 3], [5, 9]]}, r"parallel\.pipeline\.split\[1\]: stage starts at layer 5, expected 4"),
    ({"stages": 2, "split": [[0, 3], [4]]}, r"parallel\.pipeline\.split\[1\]: expected \[first, last\]"),
    ({"stages": 2, "split": "balanced"}, r"parallel\.pipeline\.split: 'balanced' is not one of \['auto'\]"),
])
def test_section_errors_name_the_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**kw)


@pytest.mark.parametrize("kw,args,match", [
    ({"stages": 4, "schedule": "interleaved_1f1b", "virtual_stages": 2}, (6, 8, 4),
     r"parallel\.pipeline\.stages: 4 stages x 2 virtual stages model chunks, but the dense model has only 6 layers"),
    ({"stages": 8}, (6, 8, 8), r"parallel\.pipeline\.stages: 8 model chunks, but the dense model has only 6 layers"),
    ({"stages": 2, "micro_batches": 3}, (10, 8, 2),
     r"parallel\.pipeline\.micro_batches: 3 does not divide the pipeline replica's batch of 16 samples"),
    ({"stages": 2}, (10, 8, 3), r"parallel\.pipeline\.stages: the world size 3 is not a multiple of 2 stages"),
    ({"stages": 2, "schedule": "zero_bubble", "micro_batches": 5}, (10, 10, 2),
     r"parallel\.pipeline\.micro_batches: schedule zero_bubble runs micro-batches in rounds of 2 .* 2 rounds"),
    ({"stages": 2, "split": [[0, 3], [4, 8]]}, (10, 8, 2), r"parallel\.pipeline\.split: must cover layers 0 \.\. 9"),
])
def test_cross_section_errors_name_the_field(kw, args, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**kw).check(*args)
    _cfg(stages=2, micro_batches=4).check(10, 8, 4)           # a valid one passes


def test_mesh_places_chunks_samples_and_gradient_groups():
    m = PipelineMesh(world_size=4, stages=2, virtual_stages=2)
    assert m.replicas == 2 and m.chunks == 4
    assert [m.chunks_on(p) for p in range(2)] == [[(DOWN, 0), (DOWN, 2)], [(DOWN, 1), (DOWN, 3)]]
    assert [(m.entry(p), m.exit(p)) for p in range(2)] == [(0, 1), (0, 1)]
    assert m.sources(0, DOWN) == [0, 1] and m.label_sources(1, DOWN) == [0, 1] and m.sources(1, DOWN) == []
    assert m.sync_groups() == [[0, 2], [1, 3]]

    c = PipelineMesh(world_size=8, stages=4, bidirectional=True)
    assert [c.chunks_on(p) for p in range(4)] == [[(DOWN, p), (UP, 3 - p)] for p in range(4)]
    assert [c.direction_of(p) for p in range(4)] == [DOWN, DOWN, UP, UP]
    assert [(c.entry(p), c.exit(p)) for p in range(4)] == [(0, 3), (0, 3), (3, 0), (3, 0)]
    assert c.sources(3, UP) == [2, 3] and c.label_sources(0, UP) == [2, 3] and c.sources(0, DOWN) == [0, 1]
    assert c.sync_groups() == [[0, 3, 4, 7], [1, 2, 5, 6]]
    with pytest.raises(ValueError, match="multiple of 3 stages"):
        PipelineMesh(world_size=4, stages=3)


def _replay(order, S: int, fwd: float = 1.0, bwd: float = 2.0) -> float:
    """Run the per-position orders with blocking dependencies; the makespan (fails on a deadlock)."""
    pos = lambda op: op.stage if op.direction == DOWN else S - 1 - op.stage  # noqa: E731
    finish, idx, free = {}, [0] * S, [0.0] * S
    while any(i < len(o) for i, o in zip(idx, order)):
        progressed = False
        for p in range(S):
            if idx[p] == len(order[p]):
                continue
            op = order[p][idx[p]]
            assert pos(op) == p
            deps = ([Op("F", op.direction, op.micro, op.stage - 1)] if op.kind == "F" and op.stage else []) + \
                ([Op("F", op.direction, op.micro, op.stage)] if op.kind == "B" else []) + \
                ([Op("B", op.direction, op.micro, op.stage + 1)] if op.kind == "B" and op.stage < S - 1 else [])
            if all(d in finish for d in deps):
                start = max([free[p]] + [finish[d] for d in deps])
                finish[op] = free[p] = start + (fwd if op.kind == "F" else bwd)
                idx[p] += 1
                progressed = True
        assert progressed, "deadlock"
    return max(free)


@pytest.mark.parametrize("S,M", [(2, 2), (2, 8), (4, 4), (4, 8), (6, 6)])
def test_chimera_order_is_complete_and_deadlock_free(S, M):
    order, length = chimera_order(S, M)
    ops = [op for o in order for op in o]
    assert len(ops) == len(set(ops)) == 2 * S * M                  # F and B of M micro-batches on S stages
    assert _replay(order, S) == length
    busy = 3.0 * M                                                 # per position: M forwards + M backwards
    bubble = 1 - busy / length
    one_f_one_b = (S - 1) / (M + S - 1)
    assert bubble <= one_f_one_b + 1e-9, (bubble, one_f_one_b)
    if S == 2:
        assert bubble == 0.0                                       # the two directions fill each other's bubbles


def test_chimera_order_two_stages_is_the_papers():
    order, _ = chimera_order(2, 2)
    assert [(op.kind, op.direction) for op in order[0]] == [("F", DOWN), ("F", UP), ("B", UP), ("B", DOWN)]
    with pytest.raises(ValueError, match="even number"):
        chimera_order(3, 2)


# ------------------------------------------------------------ fields set where they do not act


@pytest.mark.parametrize("kw,why", [
    ({"stages": 2, "schedule": "gpipe"}, "gpipe is synchronous: one weight version"),
    ({"stages": 2, "schedule": "1f1b"}, "1f1b is synchronous: one weight version"),
    ({"stages": 2, "schedule": "interleaved_1f1b", "virtual_stages": 2}, "interleaved_1f1b is synchronous"),
    ({"stages": 2, "schedule": "zero_bubble", "virtual_stages": 2}, "zero_bubble is synchronous"),
    ({"stages": 2, "schedule": "chimera"}, "chimera is synchronous"),
    ({"stages": 2, "schedule": "auto"}, "auto never chooses an asynchronous schedule"),
    ({"stages": 2, "schedule": "pipedream_2bw"}, "pipedream_2bw always keeps two weight versions"),
    ({}, "1f1b is synchronous: one weight version"),                     # stages 1
])
def test_config_max_versions_outside_pipedream_async_is_an_error(kw, why):
    """``max_versions`` is read by pipedream_async alone (neo/pipeline/async_schedules.py): set
    with any other schedule it is an error naming the field, its value and the schedule."""
    schedule = kw.get("schedule", "1f1b")
    for mv in (1, 3):
        with pytest.raises(ConfigError, match=rf"^parallel\.pipeline\.max_versions: {mv} has no effect with schedule "
                                              rf"{schedule} \(.*{why}.*\): remove it, or set "
                                              r"parallel\.pipeline\.schedule: pipedream_async"
                                              + ("$" if kw else r" \(with parallel\.pipeline\.stages 2 or more\)$")):
            config_from_dict({"parallel": {"pipeline": {**kw, "max_versions": mv}}})
    _cfg(**kw)                                                             # the same without it is valid
    _cfg(**kw, max_versions=None)                                          # and so is its default, given


@pytest.mark.parametrize("mv", [None, 1, 2, 4, 8])
def test_config_max_versions_is_accepted_under_pipedream_async(mv):
    p = config_from_dict({"parallel": {"pipeline": {"stages": 4, "schedule": "pipedream_async",
                                                    "max_versions": mv}}}).parallel.pipeline
    assert (p.schedule, p.max_versions) == ("pipedream_async", mv)


def test_config_stages_1_leaves_the_pipeline_shape_free():
    """With ``stages: 1`` no pipeline runs, and ``schedule``, ``micro_batches``, ``split`` and
    ``virtual_stages`` are not read; they stay accepted because ``stages: 1`` is how a pipelined
    config is turned off (neo/pipeline/trainer.py's errors advise it)."""
    for name in ("pipeline_dcn.yaml", "pipeline_deep_mlp.yaml"):
        p = load_config(os.path.join(ROOT, "configs", name), ["parallel.pipeline.stages=1"]).parallel.pipeline
        assert not p.enabled and p.micro_batches == 8
    assert not _cfg(stages=1, schedule="zero_bubble", virtual_stages=2, micro_batches=8, split=[[0, 3], [4, 9]]).enabled


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "configs"))))
def test_config_every_shipped_config_validates(name):
    if name.endswith((".yaml", ".yml")):
        load_config(os.path.join(ROOT, "configs", name))


def test_config_neo_train_refuses_max_versions_outside_pipedream_async(capsys):
    """``neo train`` says it in one line and exits 2 before relaunching under torchrun."""
    from neo.commands.train import main

    assert main([os.path.join(ROOT, "configs", "pipeline_deep_mlp.yaml"), "parallel.pipeline.max_versions=2"]) == 2
    err = capsys.readouterr().err
    assert "neo train: error: parallel.pipeline.max_versions: 2 has no effect with schedule 1f1b" in err
    assert "Traceback" not in err
