"""A config the run cannot honour stops with a message naming the field or file, before any
training: values that are not finite or out of range, a key given twice, a plan file for other
tables or another world; ``neo train`` exits 2 for these and 1 for a run whose loss stops being
finite (the run stops there instead of training on NaN weights)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from neo.config import ConfigError, config_from_dict, load_config
from neo.train.build import load_plan_file
from tests.train.test_trainer import ROOT, TINY, tiny_config


@pytest.mark.parametrize("override, match", [
    ("optim.lr=.inf", r"optim\.lr: must be a finite number >= 0, got inf"),
    ("optim.lr=-1", r"optim\.lr: must be a finite number >= 0"),
    ("optim.decay_power=-3", r"optim\.decay_power: must be a finite number >= 0"),
    ("optim.end_ratio=5", r"optim\.end_ratio: must be in \[0, 1\]"),
    ("optim.initial_accumulator_value=-0.1", r"optim\.initial_accumulator_value: must be a finite number >= 0"),
    ("train.seed=-5", r"train\.seed: must be >= 0, got -5"),
    ("tables[0].init_scale=.inf", r"tables\[0\]\.init_scale: must be null or a number in \(0, 3\.40282e\+38\]"),
    ("tables[0].pooling_factor=.inf", r"tables\[0\]\.pooling_factor: must be a finite number > 0"),
    ("tables[0].pooling_factor=1e308", r"tables\[0\]\.pooling_factor: must be a finite number > 0 and <= "
                                       r"5\.76461e\+17 .*got 1e\+308"),
    ("tables[0].access_skew=.inf", r"tables\[0\]\.access_skew: must be a finite number >= 0"),
    ("tables[0].optimizer.lr=.inf", r"tables\[0\]\.optimizer.*lr must be a finite number >= 0"),
    # the audit of 2026-11-29: a segfault (threads), an OverflowError traceback (inf timeout), a
    # table silently named 'False' (YAML's no), a partitioner nobody checked
    ("train.threads=99999999", r"train\.threads: at most 1024 torch threads per process, got 99999999"),
    ("train.collective_timeout_s=.inf", r"train\.collective_timeout_s: must be > 0 and at most 2592000"),
    ("train.collective_timeout_s=1e15", r"train\.collective_timeout_s: must be > 0 and at most"),
    ("tables[0].name=no", r"tables\[0\]\.name: got the YAML boolean False .*quote it for the text, e\.g\. 'no'"),
    ("tables[0].feature_names=[on]", r"tables\[0\]\.feature_names\[0\]: got the YAML boolean True"),
    ("sharding.partitioner=bogus", r"sharding\.partitioner: 'bogus' is not one of \['auto', 'greedy', 'karmarkar_karp'"),
    ("sharding.cache_warmup_batches=-1", r"sharding\.cache_warmup_batches: must be >= 0, got -1"),
    ("data.loader_nice=20", r"data\.loader_nice: must be in \[0, 19\] .*got 20"),
    ("data.loader_nice=-1", r"data\.loader_nice: must be in \[0, 19\]"),
])
def test_values_out_of_range_name_the_field(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(str(tmp_path), override)


def test_cache_settings_on_a_device_table_are_refused(tmp_path):
    """A cache policy on a table placed on the device would do nothing (a forgotten
    placement: cached); with placement auto it applies where the planner caches the table."""
    with pytest.raises(ConfigError, match=r"tables\[0\]\.cache_policy: set, but placement is 'device'"):
        tiny_config(str(tmp_path), "tables[0].placement=device", "tables[0].cache_policy=lfu")
    tiny_config(str(tmp_path), "tables[0].placement=auto", "tables[0].cache_policy=lfu")


def test_a_key_given_twice_is_an_error(tmp_path):
    with open(TINY) as f:
        text = f.read()
    twice = tmp_path / "twice.yaml"
    twice.write_text(text + "train:\n  batch_size: 64\n")        # a second train section would replace the first
    first = 1 + text.splitlines().index("train:")
    with pytest.raises(ConfigError, match=rf"duplicate key 'train' \(first given on line {first}\)"):
        load_config(str(twice))
    inner = tmp_path / "inner.yaml"
    inner.write_text(text.replace("train:\n", "train:\n  seed: 1\n  seed: 2\n", 1))
    with pytest.raises(ConfigError, match=r"duplicate key 'seed'"):
        load_config(str(inner))


def _plan(tmp_path, name: str, *args: str) -> str:
    """A plan file of the tiny config written by ``neo plan ... --out`` (run in this process)."""
    from neo.commands.plan import main as plan_main

    out = str(tmp_path / name)
    assert plan_main([TINY, *args, "--out", out]) == 0
    return out


def test_a_plan_file_must_fit_the_run(tmp_path):
    cfg = tiny_config(str(tmp_path))
    specs = cfg.table_specs()
    good = _plan(tmp_path, "one.json", "--world-size", "1", "--local-world-size", "1")
    assert load_plan_file(good, specs, 1, 1).world_size == 1
    with pytest.raises(ConfigError, match=r"planned for 1 ranks \(1 per host\); this run has 2 \(2 per host\)"):
        load_plan_file(good, specs, 2, 2)
    # a type the config pins (sharding.types) that the plan does not use: named, not silently ignored
    kind = load_plan_file(good, specs, 1, 1).tables[specs[0].name].sharding_type.value
    other = "column_wise" if kind != "column_wise" else "table_wise"
    pinned = tiny_config(str(tmp_path), f"sharding.types.{specs[0].name}={other}").table_specs()
    with pytest.raises(ConfigError, match=rf"table '{specs[0].name}': the plan shards it {kind}, the config "
                                          rf"allows only \['{other}'\] \(sharding\.types"):
        load_plan_file(good, pinned, 1, 1)
    small = _plan(tmp_path, "small.json", "--world-size", "1", "--local-world-size", "1", "tables[0].num_rows=100")
    with pytest.raises(ConfigError, match=rf"table '{specs[0].name}' \({specs[0].rows} x {specs[0].dim} in the config\)"):
        load_plan_file(small, specs, 1, 1)
    with open(good) as f:
        plan = json.load(f)
    name = sorted(plan["tables"])[0]
    plan["tables"]["extra"] = plan["tables"].pop(name)
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(plan))
    with pytest.raises(ConfigError, match=rf"not planned \['{name}'\], not in the config \['extra'\]"):
        load_plan_file(str(renamed), specs, 1, 1)
    with open(good) as f:
        plan = json.load(f)
    plan["tables"][name]["placement"] = "cached"                  # hand-edited: no cache share given
    cached = tmp_path / "cached.json"
    cached.write_text(json.dumps(plan))
    with pytest.raises(ConfigError, match=rf"table '{name}': placement 'cached' needs cache_load_factor, .* in "
                                          r"\(0, 1\]; the plan has None"):
        load_plan_file(str(cached), specs, 1, 1)
    from neo.planner import Plan
    from neo.planner.report import format_report

    report = format_report(Plan.load(str(cached)))               # the figures it lacks print as "-"
    assert any(line.split() == [name, "-", "-", "-", "-"] for line in report.splitlines()), report
    plan["tables"][name].update(cache_load_factor=0.25, cache_rows=-3)
    cached.write_text(json.dumps(plan))
    with pytest.raises(ConfigError, match=rf"table '{name}': cache_rows must be a positive integer, the plan has -3"):
        load_plan_file(str(cached), specs, 1, 1)
    (tmp_path / "bad.json").write_text("{bad")
    with pytest.raises(ConfigError, match=r"bad\.json'?: not a plan written by `neo plan --out`"):
        load_plan_file(str(tmp_path / "bad.json"), specs, 1, 1)
    with pytest.raises(ConfigError, match=r"sharding\.plan_file '.*absent\.json': no such file"):
        load_plan_file(str(tmp_path / "absent.json"), specs, 1, 1)


def test_directories_that_are_files_are_named(tmp_path):
    from neo.train.build import validate_training_config

    afile = tmp_path / "afile"
    afile.write_text("")
    for field in ("run_dir", "checkpoint_dir", "cache_store_dir"):
        with pytest.raises(ConfigError, match=rf"train\.{field}: '.*afile' exists and is not a directory"):
            validate_training_config(tiny_config(str(tmp_path), f"train.{field}={afile}"))
    for path in (afile, afile / "sub"):                   # a table's own store directory, or under a file
        with pytest.raises(ConfigError, match=r"tables\[0\]\.cache_dir: '.*afile.*' is not a directory \(table '"):
            validate_training_config(tiny_config(str(tmp_path), "tables[0].placement=cached",
                                                 f"tables[0].cache_dir={path}"))


def _neo_train(tmp_data: str, *overrides: str) -> subprocess.CompletedProcess:
    """``neo train`` on the tiny config, as a command in a process of its own."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "neo.cli", "train", TINY, f"data.synthetic.cache_dir={tmp_data}/cache",
           f"train.run_dir={tmp_data}/bad", "train.progress=false", *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _neo_train_here(capsys, tmp_data: str, *overrides: str, config: str = TINY) -> subprocess.CompletedProcess:
    """The same command run in this process (``neo.cli.main``, which the ``neo`` command calls and
    exits with): its status and what it printed, without the 3 to 4 s a new interpreter takes to
    import torch. A traceback would be an exception out of this call. The tests that run the
    command itself (``_neo_train``) check that its exit status is main's return value."""
    import torch

    from neo.cli import main

    capsys.readouterr()                                 # what the test printed before
    threads = torch.get_num_threads()
    try:
        status = main(["train", config, f"data.synthetic.cache_dir={tmp_data}/cache", f"train.run_dir={tmp_data}/bad",
                       "train.progress=false", *overrides])
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["neo", "train"], status, captured.out, captured.err)


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


def test_a_yaml_alias_bomb_is_refused_with_a_short_message(tmp_path):
    """Nine levels of nested aliases (a few hundred bytes of YAML) make a list of 387 million
    strings: the error names the field without printing the value whole (it was a 254 MB
    message at eight levels)."""
    levels = ["&a0 [" + ",".join(["xxxxxxxx"] * 9) + "]"]
    levels += [f"&a{k} [" + ",".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("train:\n  run_dir: [" + ", ".join(levels) + "]\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert len(str(err.value)) < 2000 and "train.run_dir" in str(err.value), str(err.value)[:300]


def test_neo_plan_refuses_what_neo_train_refuses(tmp_path, capsys):
    """A misspelled table in sharding.types (silently dropped), an explicit planner without types,
    a bottom MLP that does not end in the tables' dim under --simulate."""
    from neo.commands.plan import main as plan_main

    for args, message in (([TINY, "sharding.types={nope: row_wise}"], r"sharding\.types: unknown tables \['nope'\]"),
                          ([TINY, "sharding.planner=explicit"], r"planner: explicit needs a type for every table"),
                          ([TINY, "--simulate", "2", "model.dense_arch=[16,4]"], r"model\.dense_arch: must end in")):
        out = [] if "--simulate" in args else ["--out", str(tmp_path / "p.json")]     # (--simulate makes no plan)
        assert plan_main(args + out) == 2
        err = capsys.readouterr().err
        assert re.search(message, err) and err.startswith("neo plan: error:"), err


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


def test_yaml_merge_keys_fill_a_mapping_and_its_own_keys_win(tmp_path):
    """``<<: *anchor`` (YAML 1.1 merge keys, as PyYAML's safe loader reads them) gives a table the
    anchored fields; a key of the mapping itself replaces a merged one (no 'duplicate key'); a key
    the mapping gives twice is still refused."""
    path = tmp_path / "merge.yaml"
    path.write_text("tables:\n"
                    "  - &base {name: t0, num_rows: 1000, dim: 16, pooling_factor: 3}\n"
                    "  - <<: *base\n"
                    "    name: t1\n"
                    "  - {<<: [*base], name: t2, dim: 32}\n"
                    "topology: {world_size: 2}\n")
    cfg = load_config(str(path))
    assert [(t.name, t.num_rows, t.dim, t.pooling_factor) for t in cfg.tables] == [
        ("t0", 1000, 16, 3.0), ("t1", 1000, 16, 3.0), ("t2", 1000, 32, 3.0)]
    for table in ("{<<: *base, name: t1, dim: 32, dim: 64}", "{<<: {dim: 32, dim: 64}, name: t1, num_rows: 10}"):
        path.write_text(f"tables:\n  - &base {{name: t0, num_rows: 1000, dim: 16}}\n  - {table}\n")
        with pytest.raises(ConfigError, match=r"duplicate key 'dim'"):
            load_config(str(path))


def test_nested_yaml_merges_stay_the_size_of_their_keys(monkeypatch):
    """Six levels of mappings each merging nine aliases of the one before: PyYAML before its
    merge-key fix (``pyyaml>=6`` allows it) appends every merged mapping's pairs, 2 x 9^5 at the
    top; the loader keeps one pair per key whatever PyYAML does."""
    import yaml

    from neo.config.loader import _YAML_LOADER

    merge_tag = "tag:yaml.org,2002:merge"

    def unfixed_flatten(self, node):               # the old algorithm: merged pairs appended, repeats kept
        merged = []
        for key_node, value in [p for p in node.value if p[0].tag == merge_tag]:
            for sub in value.value if isinstance(value, yaml.SequenceNode) else [value]:
                self.flatten_mapping(sub)
                merged.extend(sub.value)
        node.value = merged + [p for p in node.value if p[0].tag != merge_tag]

    monkeypatch.setattr(yaml.constructor.SafeConstructor, "flatten_mapping", unfixed_flatten)
    lines = ["a0: &a0 {x: 1, y: 2}"] + [f"a{k}: &a{k} {{<<: [{', '.join([f'*a{k - 1}'] * 9)}]}}" for k in range(1, 6)]
    loader = _YAML_LOADER("\n".join(lines) + "\n")
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root)
    finally:
        loader.dispose()
    assert data["a5"] == {"x": 1, "y": 2}
    assert max(len(value.value) for _, value in root.value) == 2


def test_an_override_changes_one_place_of_a_shared_yaml_node(tmp_path):
    """A mapping that aliases or merge keys share between tables (``<<: *base``, ``optimizer: *opt``)
    changes only where an override names it: the other tables keep the anchored values."""
    path = tmp_path / "shared.yaml"
    path.write_text("tables:\n"
                    "  - &base {name: t0, num_rows: 100, dim: 8, optimizer: &opt {type: adagrad, lr: 0.05}}\n"
                    "  - {<<: *base, name: t1}\n"
                    "  - {name: t2, num_rows: 100, dim: 8, optimizer: *opt}\n")
    cfg = load_config(str(path), ["tables[1].optimizer.lr=0.5", "tables[2].optimizer={lr: 0.7}"])
    assert [t.optimizer.lr for t in cfg.tables] == [0.05, 0.5, 0.7]
    assert [t.optimizer.type for t in cfg.tables] == ["adagrad"] * 3


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
