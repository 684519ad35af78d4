"""``neo train`` stops on what it finds before training with one ``neo train: error:`` line and
exit status 2, not a traceback: config errors met at setup (also under ``async_train.mode: wsp``
and before a pipelined config's ranks are launched), a bad kernel setting in the environment, a
busy master port, a run directory or trace it cannot write, Parquet files read twice or a
validation split that does not fit the tables, ``cuda`` or the Triton backend without CUDA. A run
whose loss stops being finite exits 1 (the run stops there instead of training on NaN weights)
and closes its log. The config checks themselves are in ``test_bad_config.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from neo.config import ConfigError, config_from_dict
from tests.train.bad_config_helpers import _neo_train, _neo_train_here, _plan
from tests.train.test_trainer import ROOT, TINY, tiny_config


@pytest.mark.parametrize("var,value,said", [
    ("NEO_INTERACTION_TILES", "bogus", "NEO_INTERACTION_TILES=bogus is not a tile choice; valid: auto, narrow, wide, "
                                       "grouped, tall"),
    ("NEO_CPU_ISA", "avx9000", "NEO_CPU_ISA=avx9000 is not a CPU ISA variant"),
])
def test_a_bad_kernel_setting_in_the_environment_is_one_line_and_exit_2(tmp_data, var, value, said):
    """The command itself (neo._C reads these variables once, when a process first loads it):
    exit status 2 and one ``neo train: error:`` line naming the variable, as for a config
    error, not a traceback; before the run starts (no run directory made)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **{var: value})
    cmd = [sys.executable, "-m", "neo.cli", "train", TINY, f"data.synthetic.cache_dir={tmp_data}/cache",
           f"train.run_dir={tmp_data}/bad_env", "train.progress=false"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neo train: error: neo._C: ") and said in lines[0], p.stderr
    assert not os.path.exists(f"{tmp_data}/bad_env")


def test_neo_train_exit_status_for_setup_errors_and_divergence(tmp_data, tmp_path, capsys):
    """The command itself (a process of its own) for one status of each kind; the other cases
    through main in this process (_neo_train_here)."""
    two = _plan(tmp_path, "two.json", "--world-size", "2", "--local-world-size", "2")
    p = _neo_train(tmp_data, "train.steps=2", f"sharding.plan_file={two}")
    assert p.returncode == 2, p.stderr
    assert "neo train: error: sharding.plan_file" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = _neo_train_here(capsys, tmp_data, "train.steps=2", "train.batch_size=100000")
    assert p.returncode == 2 and "neo train: error: train.batch_size 100000 x 1 ranks exceeds the" in p.stderr, \
        p.stderr[-2000:]
    # a cache smaller than a batch's distinct rows, met at the first step: one line, exit 2
    p = _neo_train_here(capsys, tmp_data, "train.steps=2", "tables[0].placement=cached",
                        "tables[0].cache_load_factor=0.1")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert re.search(r"neo train: error: table '\w+#0': a batch needs \d+ distinct rows", p.stderr), p.stderr[-2000:]
    p = _neo_train(tmp_data, "train.steps=12", "train.log_every=4", "optim.lr=1e30")
    assert p.returncode == 1, p.stderr
    assert "the model diverged" in p.stderr and "over steps 1..4" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and '{"steps"' not in p.stdout, p.stdout[-500:]   # no final JSON line


@pytest.mark.parametrize("override, message", [
    ("train.eval_every=2", "train.eval_every: under async_train.mode: wsp"),
    ("async_train.virtual_workers=[[0,1]]", "async_train.virtual_workers: must hold every rank"),
    ("train.batch_size=100000", "train.batch_size 100000 x 1 ranks exceeds the"),
])
def test_neo_train_under_wsp_names_config_errors(tmp_data, override, message, capsys):
    """The bounded-staleness trainer's config errors, checked before it starts or while it is
    set up, are one line and exit 2 as for the synchronous trainer."""
    p = _neo_train_here(capsys, tmp_data, "async_train.mode=wsp", "train.steps=4", "train.epochs=0", override)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"neo train: error: {message}" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("override, message", [
    ("parallel.pipeline.stages=20", "parallel.pipeline.stages: 20 model chunks, but the dense model has only 16 layers"),
    ("parallel.pipeline.micro_batches=7", "parallel.pipeline.micro_batches: 7 does not divide"),
    ("parallel.pipeline.split=[[0,3],[4,40]]", "parallel.pipeline.split: must cover layers 0 .. 15"),
    ("train.checkpoint_dir=/tmp/never-made", "train.checkpoint_dir: checkpoints are not supported with parallel"),
    ("train.dense_dtype=bf16", "train.dense_dtype: the pipelined dense towers run in fp32"),
])
def test_a_pipeline_config_is_checked_before_its_ranks_are_launched(tmp_data, override, message, capsys,
                                                                   monkeypatch):
    """neo train relaunches a pipelined config under torchrun, one rank a stage: what each rank
    would find (20 processes on 2 cores for stages=20) is one message and exit 2 before that."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)          # a relaunch, not a rank of one
    cfg = os.path.join(ROOT, "configs", "pipeline_deep_mlp.yaml")
    p = _neo_train_here(capsys, tmp_data, "train.steps=2", override, config=cfg)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"neo train: error: {message}" in p.stderr and "torch.distributed.run" not in p.stderr, p.stderr[-2000:]


def test_a_relaunched_run_exits_with_its_ranks_status(tmp_data, tmp_path):
    """What the ranks of a relaunched (pipelined) run find at setup, a plan file for another
    world, exits 2 as in one process (torchrun itself exits 1 whatever its workers' statuses)."""
    one = _plan(tmp_path, "one.json", "--world-size", "1", "--local-world-size", "1")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cfg = os.path.join(ROOT, "configs", "pipeline_deep_mlp.yaml")
    p = subprocess.run([sys.executable, "-m", "neo.cli", "train", cfg, f"data.synthetic.cache_dir={tmp_data}/cache",
                        f"train.run_dir={tmp_data}/relaunched", "train.steps=2", "train.progress=false",
                        f"sharding.plan_file={one}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert "neo train: error: sharding.plan_file" in p.stderr, p.stderr[-3000:]
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])


def test_the_final_line_stays_json_when_a_metric_is_not_a_number():
    """No validation samples (an empty validation file) give NaN metrics: the final line writes
    them as null (json.dumps would write the bare word NaN, which JSON parsers refuse)."""
    from data_pipeline.writer import json_ready

    final = {"auc": float("nan"), "logloss": float("inf"), "eval_samples": 0, "steps": 3,
             "phase_ms_per_step": {"data": 0.5, "lookup": float("-inf")}, "curve": [1.0, float("nan")]}
    line = json.dumps(json_ready(final), allow_nan=False)
    assert json.loads(line) == {"auc": None, "logloss": None, "eval_samples": 0, "steps": 3,
                                "phase_ms_per_step": {"data": 0.5, "lookup": None}, "curve": [1.0, None]}


def test_a_busy_master_port_is_one_line(tmp_data):
    """Another process listens on MASTER_PORT: neo train says which address and what to do, exit 2
    (it was torch's DistNetworkError traceback; audit of 2026-11-29)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                   WORLD_SIZE="1")
        cmd = [sys.executable, "-m", "neo.cli", "train", TINY, f"data.synthetic.cache_dir={tmp_data}/cache",
               f"train.run_dir={tmp_data}/busy", "train.steps=2", "train.collective_timeout_s=20"]
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"MASTER_ADDR:MASTER_PORT = 127.0.0.1:{port}" in p.stderr and "another process may hold the port" in p.stderr


def test_cuda_without_cuda_is_one_line(tmp_data, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: train.device=cuda is a valid choice here")
    p = _neo_train_here(capsys, tmp_data, "train.steps=2", "train.device=cuda")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "neo train: error: train.device: 'cuda', but this torch sees no CUDA device" in p.stderr, p.stderr[-2000:]


def test_a_parquet_file_read_twice_or_in_both_splits_is_refused(tmp_path):
    import types

    from neo.train.build import resolve_tables
    from neo.train.data import prepare_data
    from tests.data_pipeline.test_dp_loader import write_indexed

    write_indexed(tmp_path / "train", n=600, rows_per_file=300)
    write_indexed(tmp_path / "val", n=300, rows_per_file=300)
    one = types.SimpleNamespace(rank=0, world_size=1)
    files = sorted(str(p) for p in (tmp_path / "train").glob("*.parquet"))

    def prepare(train, val):
        cfg = config_from_dict({
            "tables": [{"name": "a", "num_rows": 1000, "dim": 8}, {"name": "b", "num_rows": 9000, "dim": 8}],
            "model": {"interaction": "dot", "dense_arch": [8], "over_arch": [4, 1]},
            "data": {"source": "parquet", "train_paths": train, "val_paths": val},
            "train": {"batch_size": 50, "run_dir": str(tmp_path / "run")}})
        return prepare_data(cfg, resolve_tables(cfg), one)

    assert len(prepare([str(tmp_path / "train")], [str(tmp_path / "val")]).train_paths) == 2
    with pytest.raises(ConfigError, match=r"data\.train_paths: .*part-0+0\.parquet is given twice in it"):
        prepare([str(tmp_path / "train"), files[0]], [str(tmp_path / "val")])
    with pytest.raises(ConfigError, match=r"data\.val_paths: .*part-0+1\.parquet is given in data\.train_paths too"):
        prepare([str(tmp_path / "train")], [files[1]])


def test_the_validation_split_is_checked_before_training(tmp_path):
    """Validation Parquet whose ids outgrow the tables (its metadata says so), or of another layout
    than the training files: refused when the data is prepared, not at the first evaluation."""
    import types

    import numpy as np

    from data_pipeline.schema import DataFileError
    from neo.train.build import resolve_tables
    from neo.train.data import prepare_data
    from tests.data_pipeline.test_dp_loader import write_indexed

    from data_pipeline.schema import DatasetMeta, sparse_names
    from data_pipeline.writer import Columns, ShardWriter, WriterOptions

    def write(name, num_dense, table_sizes=None):
        n = 100
        meta = DatasetMeta(num_dense=num_dense, sparse_names=sparse_names(2), source="synthetic",
                           table_sizes=table_sizes)
        w = ShardWriter(str(tmp_path / name), meta, "onehot", WriterOptions(rows_per_file=n))
        w.write(Columns(np.zeros(n, np.int8), np.zeros((n, num_dense), np.float32),
                        [np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)]))
        w.close()

    write_indexed(tmp_path / "train", n=300, rows_per_file=300)
    write("val_big", 2, table_sizes=[1000, 90000])
    write("val_wide", 5)
    one = types.SimpleNamespace(rank=0, world_size=1)

    def prepare(val):
        cfg = config_from_dict({
            "tables": [{"name": "a", "num_rows": 1000, "dim": 8}, {"name": "b", "num_rows": 9000, "dim": 8}],
            "model": {"interaction": "dot", "dense_arch": [8], "over_arch": [4, 1]},
            "data": {"source": "parquet", "train_paths": [str(tmp_path / "train")], "val_paths": [val]},
            "train": {"batch_size": 50, "run_dir": str(tmp_path / "run")}})
        return prepare_data(cfg, resolve_tables(cfg), one)

    with pytest.raises(ConfigError, match=r"val_big.*part-0+0\.parquet's metadata.*90000"):
        prepare(str(tmp_path / "val_big"))
    with pytest.raises(DataFileError, match=r"val_wide.*num_dense is 5 \(metadata\), not .*unlike .*train"):
        prepare(str(tmp_path / "val_wide"))


def test_a_run_dir_or_trace_that_cannot_be_written_is_found_before_training(tmp_data, tmp_path, capsys):
    """train.run_dir under a regular file, train.trace naming a directory or under a regular file:
    one line, exit 2, before any training (before, a traceback after the run: the trace is written
    at its end; audit of 2026-11-30). The same check without the file system's say: os.access."""
    from neo.train.build import check_writable

    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    for override, message in ((f"train.run_dir={tmp_path}/afile/run", r"train\.run_dir: '.*afile/run' cannot be "
                                                                       r"made: '.*afile' is not a directory"),
                              (f"train.trace={tmp_path}/adir", r"train\.trace: '.*adir' is a directory; give "
                                                               r"the trace a file name"),
                              (f"train.trace={tmp_path}/afile/t.json", r"train\.trace: .* is not a directory"),
                              (f"data.synthetic.cache_dir={tmp_path}/afile",
                               r"data\.synthetic\.cache_dir: '.*afile' exists and is not a directory")):
        p = _neo_train_here(capsys, tmp_data, "train.steps=2", override)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert re.search(r"neo train: error: " + message, p.stderr), p.stderr[-2000:]
        assert "samples_per_s" not in p.stdout                   # nothing trained
    check_writable(str(tmp_path / "new" / "deeper"), "train.run_dir")          # made later, by the run
    assert not (tmp_path / "new").exists()                                      # the check makes nothing
    import errno
    import tempfile

    def read_only(*a, **k):                       # what os.access does not see (root on /proc, some mounts)
        raise OSError(errno.EROFS, "Read-only file system")

    real = tempfile.mkdtemp
    tempfile.mkdtemp = read_only
    try:
        with pytest.raises(ConfigError, match=r"train\.run_dir: .* cannot be written \(.*Read-only file system\)"):
            check_writable(str(tmp_path / "new"), "train.run_dir")
    finally:
        tempfile.mkdtemp = real
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]     # no probe left behind
    # neo mlperf's runs write under its results directory: the config's run_dir is not checked there
    from neo.train.build import validate_training_config

    cfg = tiny_config(str(tmp_path), f"train.run_dir={tmp_path}/afile/run")
    validate_training_config(cfg, outputs=False)
    with pytest.raises(ConfigError, match=r"train\.run_dir: .* is not a directory"):
        validate_training_config(cfg)


def test_the_triton_backend_on_the_cpu_is_one_line(tmp_data, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    p = _neo_train_here(capsys, tmp_data, "train.steps=2", "train.embedding_backend=triton")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "neo train: error: train.embedding_backend: 'triton' runs on CUDA tensors" in p.stderr, p.stderr[-2000:]


def test_a_run_that_raises_closes_its_log(tmp_data):
    """A diverged run (an exception out of fit()) closes its run log: TensorBoard's writer thread,
    left running at interpreter exit, could abort the process ("terminate called without an
    active exception", seen once in a CI run of the divergence test above)."""
    import threading

    from neo.train.trainer import Trainer, TrainingDiverged

    cfg = tiny_config(tmp_data, "train.steps=12", "train.log_every=4", "optim.lr=1e30",
                      f"train.run_dir={tmp_data}/diverged")
    before = {t.ident for t in threading.enumerate()}
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    with pytest.raises(TrainingDiverged):
        trainer.fit()
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not [t for t in left if "AsyncWriter" in type(t).__name__], left


def test_a_config_error_is_said_before_the_checkpoint_library_loads(tmp_data):
    """``neo train``'s setup checks run before torch.distributed.checkpoint is imported (with DTensor
    and sympy it was 0.6 to 0.9 s of every start on a 2-core VM): the trainer's module imports the
    checkpoint package, whose reader and writer import DCP only when a checkpoint is loaded or saved."""
    code = ("import sys\nfrom neo.cli import main\n"
            f"status = main(['train', {TINY!r}, 'data.synthetic.cache_dir={tmp_data}/cache', "
            f"'train.run_dir={tmp_data}/bad', 'train.steps=2', 'train.embedding_backend=triton'])\n"
            "import neo.train.trainer\n"
            "print(status, sorted(m for m in ('torch.distributed.checkpoint', 'sympy') if m in sys.modules))\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "neo train: error: train.embedding_backend" in p.stderr, p.stderr[-2000:]
    assert p.stdout.split("\n")[-2] == "2 []", p.stdout[-2000:]
