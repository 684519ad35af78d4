"""``neo partition`` and ``neo profile-layers`` refuse what they cannot do up front, with one
``neo <cmd>: error: ...`` line and exit status 2 naming the option: a device count whose dynamic
program would run for minutes, numbers that overflow, an --out that cannot be written, a batch or
thread count past what the machine holds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neo.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "train_tiny.yaml")
FAST = ["--batch-size", "32", "--repeats", "1", "--warmup", "0", "--threads", "1", "--bandwidth", "constants"]


def _profile(tmp_path, fwd=1.0, L=5, bandwidth=10.0):
    rows = [{"name": f"top.{k}", "fwd_ms": fwd, "bwd_ms": 2.0, "activation_bytes": 4096, "param_bytes": 40_000}
            for k in range(L)]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"layers": rows, "bandwidth_gbps": bandwidth}))
    return str(path)


def _one_line_error(capsys, prog, message):
    err = capsys.readouterr().err
    assert err.startswith(f"neo {prog}: error: ") and message in err and err.count("\n") == 1, err


def test_partition_bounds_devices(tmp_path, capsys):
    path = _profile(tmp_path)
    assert main(["partition", path, "--stages", "2", "--devices", "99999999999"]) == 2
    _one_line_error(capsys, "partition", "--devices 99999999999: at most 4096")
    assert main(["partition", path, "--stages", "2", "--devices", "4097"]) == 2
    _one_line_error(capsys, "partition", "--devices 4097: at most 4096")
    assert main(["partition", path, "--stages", "2", "--devices", "64"]) == 0
    assert sum(json.loads(capsys.readouterr().out)["replicas"]) == 64


@pytest.mark.parametrize("args, fwd, message", [
    (["--speeds", "1e-320,1"], 1.0, "--speeds[0] 1e-320: so slow that even the profile's fastest layer"),
    (["--speeds", "1,1e-320"], 1.0, "--speeds[1] 1e-320: so slow"),
    (["--bandwidth-gbps", "1e-320"], 1.0, "--bandwidth-gbps 1e-320: the profile's transfers take an infinite time"),
    ([], 1e308, "its layers' fwd_ms + bwd_ms add up to more than a float holds"),
])
def test_partition_names_an_overflow_not_the_stages(tmp_path, capsys, args, fwd, message):
    path = _profile(tmp_path, fwd=fwd)
    assert main(["partition", path, "--stages", "2", *args]) == 2
    err = capsys.readouterr().err
    assert "--stages" not in err and "RuntimeWarning" not in err
    assert err.startswith("neo partition: error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_profile_layers_checks_out_before_profiling(tmp_path, capsys, monkeypatch):
    import neo.pipeline.profile as prof

    def no_profiling(*a, **k):
        raise AssertionError("profiled before checking --out")

    monkeypatch.setattr(prof, "profile_layers", no_profiling)
    assert main(["profile-layers", TINY, *FAST, "--out", "/proc/neo-prof.json"]) == 2
    _one_line_error(capsys, "profile-layers", "--out /proc/neo-prof.json: cannot write in its directory")
    assert main(["profile-layers", TINY, *FAST, "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "profile-layers", f"--out {tmp_path}: is a directory")
    assert os.listdir(tmp_path) == []


def test_profile_layers_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    import builtins

    out = tmp_path / "p.json"
    real_open = builtins.open

    def failing_open(file, mode="r", *a, **k):
        if str(file) == str(out) and "w" in mode:
            raise OSError(28, "No space left on device")
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", failing_open)
    assert main(["profile-layers", TINY, *FAST, "--out", str(out)]) == 2
    _one_line_error(capsys, "profile-layers", f"--out {out}: No space left on device")


def test_profile_layers_bounds_the_batch_size(capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        main(["profile-layers", TINY, "--batch-size", "1000000000000"])
    assert e.value.code == 2
    assert "argument --batch-size: must be in [1, 16777216]" in capsys.readouterr().err

    import neo.commands.profile_layers as cmd
    monkeypatch.setattr(cmd, "_free_bytes", lambda device: 1000)
    assert main(["profile-layers", TINY, *FAST]) == 2
    _one_line_error(capsys, "profile-layers", "--batch-size 32: its inputs and their gradients alone need")


def test_profile_layers_turns_an_allocation_failure_into_one_line(capsys, monkeypatch):
    import neo.pipeline.profile as prof

    def oom(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 16000000000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(prof, "profile_layers", oom)
    assert main(["profile-layers", TINY, *FAST]) == 2
    _one_line_error(capsys, "profile-layers", "--batch-size 32: out of memory on cpu while profiling")


@pytest.mark.parametrize("threads", ["99999999", str(4 * (os.cpu_count() or 1) + 1)])
def test_profile_layers_bounds_threads(threads, tmp_path):
    # a subprocess: torch.set_num_threads(99999999) crashes the interpreter (SIGSEGV)
    cmd = [sys.executable, "-m", "neo.cli", "profile-layers", TINY, "--batch-size", "8", "--repeats", "1",
           "--warmup", "0", "--bandwidth", "constants", "--threads", threads]
    r = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert f"argument --threads: must be in [1, {4 * (os.cpu_count() or 1)}]" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("device", ["meta", "xpu", "mps"])
def test_profile_layers_profiles_on_cpu_or_cuda_only(device, capsys):
    """A device torch knows but the profiler does not time (before: a traceback for xpu and mps,
    made-up times for meta; audit of 2026-11-30)."""
    assert main(["profile-layers", TINY, "--device", device, *FAST]) == 2
    _one_line_error(capsys, "profile-layers", f"--device {device}: the layers are profiled on cpu or cuda")


def test_plan_refuses_an_out_it_cannot_write_and_flags_without_simulate(tmp_path, capsys):
    """Found before planning (before: the report, then the error) and not silently ignored."""
    for args, message in (([f"--out={tmp_path}/missing/p.json"], "its directory does not exist"),
                          (["--json"], "--json: only with --simulate"),
                          (["--strong"], "--strong: only with --simulate"),
                          (["--simulate", "8", f"--out={tmp_path}/p.json"], "--out: writes a plan, which --simulate")):
        assert main(["plan", TINY, *args]) == 2
        _one_line_error(capsys, "plan", message)
