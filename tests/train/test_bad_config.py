"""A config the run cannot honour is refused with a message naming the field or file, before any
training: values that are not finite or out of range, a key given twice (also under YAML merge
keys), a YAML alias bomb, an override of a node that aliases share, a plan file for other tables
or another world, a directory that is a file; ``neo plan`` refuses what ``neo train`` refuses.
What ``neo train`` does when it meets such errors (its exit status, one line, no traceback) is in
``test_bad_launch.py``."""

from __future__ import annotations

import json
import re

import pytest

from neo.config import ConfigError, load_config
from neo.train.build import load_plan_file
from tests.train.bad_config_helpers import _plan
from tests.train.test_trainer import TINY, tiny_config


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
