"""PipeDream's partitioner: the DP's bottleneck equals brute force; its speed; bad input; ``neo partition``."""

import itertools
import json
import random
import time

import pytest

from neo.cli import main
from neo.pipeline.partition import (LayerProfile, Partition, PartitionError, Profile, load_profile, partition,
                                    profile_from_dict, stage_time_ms)


def _profile(rng, L, bandwidth=None):
    layers = tuple(LayerProfile(f"l{k}", rng.uniform(0, 3), rng.uniform(0, 5), rng.randrange(0, 4_000_000),
                                rng.randrange(0, 8_000_000)) for k in range(L))
    return Profile(layers, bandwidth or rng.choice([1.0, 5.0, 50.0]))


def _brute(p, S, N, speeds):
    """Least bottleneck over every contiguous split and every replica assignment summing to N."""
    L, best = len(p.layers), None
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = [0, *cuts, L]
        for reps in itertools.product(range(1, N - S + 2), repeat=S):
            if sum(reps) != N:
                continue
            v = max(stage_time_ms(p, b[s], b[s + 1] - 1, p.bandwidth_gbps, reps[s], speeds[s]) for s in range(S))
            best = v if best is None else min(best, v)
    return best


def _check_shape(part: Partition, L: int, S: int, N: int):
    assert len(part.stages) == S and part.stages[0][0] == 0 and part.stages[-1][1] == L - 1
    for (a, b), (c, _) in zip(part.stages, part.stages[1:]):
        assert a <= b and c == b + 1
    assert len(part.replicas) == S and sum(part.replicas) == N and min(part.replicas) >= 1
    assert part.bottleneck_ms == max(part.stage_ms)


def test_optimal_against_brute_force_one_device_per_stage():
    rng = random.Random(0)
    for _ in range(150):
        L = rng.randint(1, 8)
        S = rng.randint(1, L)
        p = _profile(rng, L)
        part = partition(p, S)
        _check_shape(part, L, S, S)
        assert part.bottleneck_ms == pytest.approx(_brute(p, S, S, [1.0] * S), rel=1e-9, abs=1e-12)
        for s, (a, b) in enumerate(part.stages):     # the reported stage times follow the documented model
            work = sum(l.fwd_ms + l.bwd_ms for l in p.layers[a:b + 1])
            comm = 2 * p.layers[b].activation_bytes / (p.bandwidth_gbps * 1e9) * 1e3 if b < L - 1 else 0.0
            assert part.stage_ms[s] == pytest.approx(work + comm, rel=1e-12)


def test_optimal_against_brute_force_with_replicas_and_speeds():
    rng = random.Random(1)
    for _ in range(120):
        L = rng.randint(1, 6)
        S = rng.randint(1, L)
        N = S + rng.randint(0, 3)
        speeds = [rng.choice([0.5, 1.0, 2.0]) for _ in range(S)]
        p = _profile(rng, L)
        part = partition(p, S, devices=N, speeds=speeds)
        _check_shape(part, L, S, N)
        assert part.bottleneck_ms == pytest.approx(_brute(p, S, N, speeds), rel=1e-9, abs=1e-12)


def test_hand_computed_cases():
    layers = tuple(LayerProfile(f"l{k}", 1.0, 2.0, 0, 1000) for k in range(4))
    p = Profile(layers, 10.0)
    part = partition(p, 2)
    assert part.stages == [(0, 1), (2, 3)] and part.stage_ms == [6.0, 6.0] and part.replicas == [1, 1]
    # a slow second device takes fewer layers: speeds 1 and 0.5 -> [0..2] (9 ms), [3] (6 ms)
    part = partition(p, 2, speeds=[1.0, 0.5])
    assert part.stages == [(0, 2), (3, 3)] and part.bottleneck_ms == pytest.approx(9.0)
    # a heavy activation moves the cut: 3 MB at 1 GB/s costs 2 * 3 ms after layer 1 (12 ms there)
    heavy = tuple(LayerProfile(f"l{k}", 1.0, 2.0, 3 * 10**6 if k == 1 else 0, 0) for k in range(4))
    part = partition(Profile(heavy, 1.0), 2)
    assert part.stages in ([(0, 0), (1, 3)], [(0, 2), (3, 3)]) and part.bottleneck_ms == pytest.approx(9.0)
    # 4 devices, 1 stage: replicated 4 times, weight sync 4 * 3/4 * 4000 bytes at 10 GB/s
    part = partition(p, 1, devices=4)
    assert part.replicas == [4]
    assert part.bottleneck_ms == pytest.approx((12.0 + 3 * 4000 / 1e7) / 4)


def test_200_layers_16_stages_is_fast():
    p = _profile(random.Random(2), 200, bandwidth=10.0)
    partition(p, 16)                                         # numpy warm-up
    t0 = time.perf_counter()
    part = partition(p, 16)
    seconds = time.perf_counter() - t0
    print(f"\npartition of 200 layers into 16 stages: {seconds * 1e3:.1f} ms")
    assert seconds < 2.0
    _check_shape(part, 200, 16, 16)
    # no single boundary move improves the bottleneck (a cheap check of optimality at this size)
    for s in range(15):
        for delta in (-1, 1):
            b = [a for a, _ in part.stages] + [200]
            b[s + 1] += delta
            if b[s + 1] <= b[s] or b[s + 1] >= b[s + 2]:
                continue
            moved = max(stage_time_ms(p, b[k], b[k + 1] - 1, 10.0) for k in range(16))
            assert moved >= part.bottleneck_ms - 1e-9


@pytest.mark.parametrize("kwargs, message", [
    (dict(stages=12), "stages: 12 exceeds the profile's 3 layers"),
    (dict(stages=0), "stages: must be >= 1, got 0"),
    (dict(stages=2, devices=1), "devices: 1 is fewer than the 2 stages"),
    (dict(stages=2, speeds=[1.0]), "speeds: needs one speed per stage (2), got 1"),
    (dict(stages=2, speeds=[1.0, 0.0]), "speeds[1]: must be a finite number > 0"),
    (dict(stages=2, bandwidth_gbps=-1.0), "bandwidth_gbps: must be a finite number > 0"),
])
def test_bad_requests_name_the_field(kwargs, message):
    p = Profile(tuple(LayerProfile(f"l{k}", 1.0, 1.0, 8, 8) for k in range(3)), 1.0)
    with pytest.raises(PartitionError) as e:
        partition(p, **kwargs)
    assert message in str(e.value)


def test_missing_bandwidth():
    p = Profile(tuple(LayerProfile(f"l{k}", 1.0, 1.0, 8, 8) for k in range(3)))
    assert partition(p, 1).stages == [(0, 2)]                # one stage, one device: no transfer
    with pytest.raises(PartitionError, match=r"bandwidth_gbps: needed \(the profile has none\)"):
        partition(p, 2)
    assert partition(p, 2, bandwidth_gbps=1.0).stages in ([(0, 0), (1, 2)], [(0, 1), (2, 2)])


@pytest.mark.parametrize("data, message", [
    ({"bandwidth_gbps": 1.0}, "profile: missing field 'layers'"),
    ({"layers": []}, "layers: must be a non-empty list"),
    ({"layers": [{"name": "a", "fwd_ms": 1, "activation_bytes": 4, "param_bytes": 4}]},
     "layers[0]: missing field 'bwd_ms'"),
    ({"layers": [{"name": "a", "fwd_ms": -1, "bwd_ms": 1, "activation_bytes": 4, "param_bytes": 4}]},
     "layers[0].fwd_ms: must be a finite number >= 0, got -1"),
    ({"layers": [{"name": "a", "fwd_ms": 1, "bwd_ms": "x", "activation_bytes": 4, "param_bytes": 4}]},
     "layers[0].bwd_ms: expected a number"),
    ({"layers": [{"name": "a", "fwd_ms": 1, "bwd_ms": 1, "activation_bytes": 4.5, "param_bytes": 4}]},
     "layers[0].activation_bytes: expected an integer"),
    ({"layers": [{"name": "a", "fwd_ms": 1, "bwd_ms": 1, "activation_bytes": 4, "param_bytes": 4}],
      "bandwidth_gbps": 0}, "bandwidth_gbps: must be > 0"),
])
def test_bad_profiles_name_the_field(data, message):
    with pytest.raises(PartitionError) as e:
        profile_from_dict(data)
    assert message in str(e.value)


def _write(tmp_path, L=9, bandwidth=10.0):
    rows = [{"name": f"top.{k}", "fwd_ms": 1.0 + k % 3, "bwd_ms": 2.0, "activation_bytes": 4096,
             "param_bytes": 40_000} for k in range(L)]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"layers": rows, "bandwidth_gbps": bandwidth, "batch_size": 64}))
    return str(path)


def test_cli_prints_one_json_line(tmp_path, capsys):
    path = _write(tmp_path)
    assert load_profile(path).meta == {"batch_size": 64}
    assert main(["partition", path, "--stages", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert set(out) == {"stages", "stage_ms", "bottleneck_ms"}
    assert out["stages"][0][0] == 0 and out["stages"][-1][1] == 8 and len(out["stage_ms"]) == 3
    assert out["bottleneck_ms"] == pytest.approx(partition(load_profile(path), 3).bottleneck_ms)

    assert main(["partition", path, "--stages", "3", "--devices", "5", "--bandwidth-gbps", "100"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sum(out["replicas"]) == 5 and len(out["replicas"]) == 3

    assert main(["partition", path, "--stages", "2", "--micro-batches", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["schedules"]) >= {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "chimera"}
    assert out["best_schedule"] in out["schedules"]


def test_cli_errors(tmp_path, capsys):
    path = _write(tmp_path)
    assert main(["partition", path, "--stages", "12"]) == 2
    assert "--stages 12 exceeds the profile's 9 layers" in capsys.readouterr().err
    assert main(["partition", path, "--stages", "0"]) == 2
    assert "--stages must be >= 1, got 0" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layers": [{"name": "a", "fwd_ms": -2, "bwd_ms": 1, "activation_bytes": 1,
                                           "param_bytes": 1}], "bandwidth_gbps": 1}))
    assert main(["partition", str(bad), "--stages", "1"]) == 2
    assert "bad.json': layers[0].fwd_ms: must be a finite number >= 0, got -2" in capsys.readouterr().err
    assert main(["partition", path, "--stages", "2", "--speeds", "1,0"]) == 2
    assert "--speeds[1] must be a finite number > 0, got 0.0" in capsys.readouterr().err
    assert main(["partition", str(tmp_path / "missing.json"), "--stages", "1"]) == 2
    assert "No such file" in capsys.readouterr().err
    # interleaved 1F1B: v chunks a rank need v x S layers, and v = 1 is plain 1F1B
    assert main(["partition", path, "--stages", "2", "--micro-batches", "8", "--virtual-stages", "0"]) == 2
    assert "--virtual-stages must be >= 1, got 0" in capsys.readouterr().err
    assert main(["partition", path, "--stages", "2", "--micro-batches", "8", "--virtual-stages", "500"]) == 2
    assert "--virtual-stages 500 x 2 stages = 1000 model chunks, but the profile has only 9 layers" in \
        capsys.readouterr().err
    assert main(["partition", path, "--stages", "2", "--micro-batches", "8", "--virtual-stages", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "interleaved_1f1b" not in out["schedules"] and out["best_schedule"] != "interleaved_1f1b"
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"layers": [{"name": f"l{i}", "fwd_ms": 1e308 if i == 0 else 1.0, "bwd_ms": 1.0,
                                            "activation_bytes": 1, "param_bytes": 1} for i in range(4)],
                                "bandwidth_gbps": 1}))
    assert main(["partition", str(huge), "--stages", "2", "--micro-batches", "8"]) == 2
    assert "huge.json': its layer times overflow the predictions (not finite)" in capsys.readouterr().err
