"""``neo profile-layers``: the profile's schema, layer names that follow the model, bytes computed
independently from the config; the layer split computes what the model computes."""

import json
from pathlib import Path

import pytest
import torch

from neo.cli import main
from neo.config import load_config
from neo.models.dlrm import DLRM
from neo.pipeline.layers import LayerStack, dense_layers, layers_of, split_stages
from neo.pipeline.partition import LAYER_FIELDS, load_profile, partition

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "train_tiny.yaml")
B = 32
FAST = ["--batch-size", str(B), "--repeats", "2", "--warmup", "1", "--threads", "1"]


def _run(tmp_path, capsys, *extra):
    out = tmp_path / "profile.json"
    rc = main(["profile-layers", TINY, *FAST, "--out", str(out), *extra])
    assert rc == 0, capsys.readouterr().err
    return json.loads(out.read_text())


def _expected(interaction: str, dcn_layers: int = 0, rank: int = 0):
    """(name, activation bytes, parameter bytes) of train_tiny's layers, from its numbers:
    4 dense features, dense_arch [16, 8], 4 features of dim 8, over_arch [16, 1]."""
    F, D, n_dense, f32 = 4, 8, 4, 4
    pooled = B * F * D * f32
    rows = [("bottom.0", B * 16 * f32 + pooled, (4 * 16 + 16) * f32),
            ("bottom.1", B * 8 * f32 + pooled, (16 * 8 + 8) * f32)]
    if interaction == "dot":
        width = D + (F + 1) * F // 2                                 # 18
        rows.append(("interaction", B * width * f32, 0))
    else:
        width = (F + 1) * D                                          # 40
        rows.append(("interaction", B * width * f32, 0))
        for l in range(dcn_layers):
            last = l == dcn_layers - 1
            rows.append((f"interaction.{l}", B * width * f32 * (1 if last else 2),
                         (width * rank + rank * width + width) * f32))
    rows += [("top.0", B * 16 * f32, (width * 16 + 16) * f32), ("top.1", B * 1 * f32, (16 + 1) * f32)]
    assert n_dense == 4
    return rows


def _check(d, expected):
    assert set(d) >= {"layers", "bandwidth_gbps"}
    assert d["batch_size"] == B and d["bandwidth_gbps"] > 0
    assert [l["name"] for l in d["layers"]] == [e[0] for e in expected]
    for row, (name, act, params) in zip(d["layers"], expected):
        assert set(row) == set(LAYER_FIELDS)
        assert row["fwd_ms"] >= 0 and row["bwd_ms"] >= 0
        assert row["activation_bytes"] == act, name
        assert row["param_bytes"] == params, name


def test_profile_dot(tmp_path, capsys):
    d = _run(tmp_path, capsys, "--bandwidth-gbps", "7.5")
    _check(d, _expected("dot"))
    assert d["bandwidth_gbps"] == 7.5 and d["bandwidth_source"] == "--bandwidth-gbps"
    assert d["device"] == "cpu" and d["threads"] == 1
    prof = load_profile(str(tmp_path / "profile.json"))                # what neo partition reads
    assert len(partition(prof, 3).stages) == 3


def test_profile_dcn_and_planner_bandwidth(tmp_path, capsys):
    d = _run(tmp_path, capsys, "--bandwidth", "constants", "model.interaction=dcn", "model.dcn_layers=2",
             "model.dcn_rank=4")
    _check(d, _expected("dcn", dcn_layers=2, rank=4))
    assert d["bandwidth_source"].startswith("planner cost constants intra_bw")


def test_profile_to_stdout_and_bad_config(tmp_path, capsys):
    assert main(["profile-layers", TINY, *FAST, "--bandwidth-gbps", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    _check(d, _expected("dot"))
    assert main(["profile-layers", TINY, *FAST, "model.dense_arch=[16,4]"]) == 2
    assert "model.dense_arch: must end in the tables' dim 8" in capsys.readouterr().err
    import torch

    bad = [(["--out", str(tmp_path / "absent" / "p.json")], "its directory does not exist"),
           (["--out", str(tmp_path)], "is a directory"),
           (["--device", "tpu"], "--device 'tpu': not a device torch knows")]
    if not torch.cuda.is_available():
        bad.append((["--device", "cuda"], "--device cuda: this torch has no CUDA device"))
    for args, message in bad:       # refused before any layer is profiled
        assert main(["profile-layers", TINY, *FAST, *args]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("overrides", [[], ["model.interaction=dcn", "model.dcn_layers=3", "model.dcn_rank=5"]])
def test_layers_compute_the_model_head(overrides):
    cfg = load_config(TINY, overrides)
    m = cfg.model
    torch.manual_seed(0)
    model = DLRM(torch.nn.Identity(), 4, 8, 4, m.dense_arch, m.over_arch, m.interaction, m.dcn_layers, m.dcn_rank)
    dense, pooled = torch.randn(6, 4), torch.randn(6, 32)
    want = model.head(dense, pooled)                                   # (B,)
    layers = layers_of(model)
    got, = LayerStack(layers)(dense, pooled)
    torch.testing.assert_close(got, want)
    # any contiguous split computes the same; stages hold the model's parameters
    stages = split_stages(layers, [(0, 1), (2, len(layers) - 2), (len(layers) - 1, len(layers) - 1)])
    acts = (dense, pooled)
    for st in stages:
        acts = st(*acts)
    torch.testing.assert_close(acts[0], want)
    assert sum(p.numel() for st in stages for p in st.parameters()) == sum(p.numel() for p in model.parameters())
    # a fresh build from the config: same names, same initialisation under the same seed
    torch.manual_seed(0)
    fresh = dense_layers(m, 4, 4, 8)
    assert [n for n, _ in fresh] == [n for n, _ in layers]
    torch.testing.assert_close(LayerStack(fresh)(dense, pooled)[0], want)


@pytest.mark.multiprocess
def test_measured_bandwidth():
    from neo.pipeline.profile import measure_p2p_bandwidth

    gbps = measure_p2p_bandwidth(nbytes=1 << 20, repeats=3)           # 2 spawned gloo processes, a few seconds
    assert 0.01 < gbps < 1000


def test_profile_chunks_times_each_chunk_and_zero_bubbles_two_passes():
    """One profile per chunk; the first chunk has no input pass (torch's first stage runs its whole
    backward as the weight pass), the others both; the chunks' weights are left as they were and
    without gradients."""
    from neo.pipeline.profile import profile_chunks
    from neo.pipeline.stages import ContiguousOutputs

    m = load_config(TINY).model
    torch.manual_seed(0)
    model = DLRM(torch.nn.Identity(), 4, 8, 4, m.dense_arch, m.over_arch, m.interaction, m.dcn_layers, m.dcn_rank)
    layers = layers_of(model)
    chunks = [ContiguousOutputs(c) for c in split_stages(layers, [(0, 2), (3, len(layers) - 1)])]
    before = [p.detach().clone() for p in model.parameters()]
    got = profile_chunks(chunks, B, 4, 32, repeats=2, warmup=1)
    assert len(got) == 2
    assert got[0].input_grad_ms == 0.0 and got[0].weight_grad_ms > 0
    assert got[1].input_grad_ms > 0 and got[1].weight_grad_ms > 0
    assert all(c.fwd_ms > 0 and c.bwd_ms > 0 for c in got)
    for p, q in zip(model.parameters(), before):
        assert p.grad is None
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    # by CPU time (ranks sharing cores): the same fields; zero bubble's Linears left as they were
    import time

    by_cpu = profile_chunks(chunks, B, 4, 32, repeats=2, warmup=1, clock=time.process_time)
    assert by_cpu[0].input_grad_ms == 0.0 and all(c.fwd_ms > 0 and c.weight_grad_ms > 0 for c in by_cpu)
    assert not any(getattr(m, "split_backward", False) for m in model.modules())
    with pytest.raises(ValueError, match="batch_size"):
        profile_chunks(chunks, 0, 4, 32)


@pytest.mark.parametrize("stages,v,allowed", [(2, 1, {"1f1b", "gpipe", "zero_bubble", "chimera"}),
                                              (2, 2, {"interleaved_1f1b", "zero_bubble"})])
def test_plan_pipeline_auto_picks_a_schedule_the_shape_allows(stages, v, allowed):
    """``schedule: auto`` and ``split: auto``: contiguous chunks covering every layer once, and a
    schedule among those the shape allows, chosen by the model from the chunks' own times."""
    from neo.config.parallel import PipelineConfig
    from neo.pipeline.trainer import plan_pipeline

    m = load_config(TINY).model
    torch.manual_seed(0)
    model = DLRM(torch.nn.Identity(), 4, 8, 4, m.dense_arch, m.over_arch, m.interaction, m.dcn_layers, m.dcn_rank)
    layers = layers_of(model)
    cfg = PipelineConfig(stages=stages, schedule="auto", micro_batches=4, virtual_stages=v, split="auto")
    cfg.validate()
    split, name = plan_pipeline(cfg, layers, 8, 4, 32, bandwidth_gbps=1.0, cores=2)
    assert name in allowed
    assert len(split) == stages * v and split[0][0] == 0 and split[-1][1] == len(layers) - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(split, split[1:]))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("args, message", [
    (["--bandwidth-gbps", "inf"], "must be a finite number > 0, got inf"),
    (["--bandwidth-gbps", "fast"], "'fast' is not a number"),
    (["--repeats", "0"], "must be > 0, got 0"),
])
def test_profile_layers_rejects_bad_numbers_naming_the_value(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["profile-layers", TINY, *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
