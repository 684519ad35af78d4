"""The tables/topology YAML sections: loading, overrides, validation messages, conversions."""

import textwrap
from pathlib import Path

import pytest

from neo.config import ConfigError, NeoConfig, TableConfig, config_from_dict, load_config
from neo.config.embedding import OptimizerType, WeightDType
from neo.planner import Placement, ShardingType

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "configs" / "plan_example.yaml")


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent(text))
    return str(p)


def base(**table):
    t = {"name": "a", "num_rows": 10, "dim": 8}
    t.update(table)
    return {"tables": [t, {"name": "b", "num_rows": 20, "dim": 4}], "topology": {"world_size": 2, "local_world_size": 2}}


def test_example_config_loads():
    cfg = load_config(EXAMPLE)
    assert isinstance(cfg, NeoConfig)
    assert len(cfg.tables) >= 30
    assert cfg.topology.world_size == 8 and cfg.topology.local_world_size == 4
    tcs = cfg.table_configs()
    assert all(isinstance(t, TableConfig) for t in tcs)
    specs = cfg.table_specs()
    user = specs[0]
    assert user.name == "user_id" and user.state_floats_per_row == 2 * 128 and user.state_per_element
    assert user.access_skew == 1.1
    by = {s.name: s for s in specs}
    assert by["url_hash"].constraints.placement is Placement.CACHED and by["url_hash"].weight_bytes == 2
    assert by["hashtag"].constraints.sharding_types == (ShardingType.COLUMN_WISE,)
    assert by["group_ids"].constraints.ranks == (0, 1)
    assert by["item_history"].num_features == 2


def test_planner_sees_the_optimizer_state_training_keeps():
    """``optim.sparse`` replaces the optimizer of every table left at the default, for training
    and for the planner alike: the plan's memory and update costs count the Adagrad state the
    embedding module then allocates (the planner once planned those tables as SGD's, half the
    bytes of D = 128 tables, and predicted their fused backward at 0.6 of what training took)."""
    from neo.embedding import TableBatchedEmbedding

    own = {"type": "sgd", "lr": 0.5}
    cfg = config_from_dict({"tables": [{"name": "a", "num_rows": 100, "dim": 16},
                                       {"name": "b", "num_rows": 50, "dim": 8, "optimizer": own}],
                            "optim": {"sparse": {"type": "adagrad", "lr": 0.05}}})
    a, b = cfg.table_specs()
    assert (a.state_floats_per_row, a.state_per_element) == (16, True)
    assert (b.state_floats_per_row, b.state_per_element) == (0, False)      # its own optimizer is kept
    emb = TableBatchedEmbedding(cfg.table_configs(), backend="reference")
    state = sum(v.numel() * v.element_size() for k, v in emb.named_buffers()
                if not k.endswith(("_weights", "_step")))                  # the optimizers' state buffers
    assert state == sum(4 * s.state_floats(s.dim) * s.rows for s in (a, b)) == 100 * 16 * 4


def test_tiny_config_loads():
    cfg = load_config(str(ROOT / "configs" / "tiny.yaml"))
    assert [t.name for t in cfg.tables] == ["user", "item", "category", "country"]


def test_table_entry_to_table_config():
    cfg = config_from_dict(base(dtype="fp16", optimizer={"type": "adam", "lr": 0.1}, feature_names=["f1", "f2"]))
    tc = cfg.tables[0].to_table_config()
    assert tc.dtype is WeightDType.FP16 and tc.optimizer.type is OptimizerType.ADAM and tc.optimizer.lr == 0.1
    assert tc.feature_names == ("f1", "f2")


def test_overrides():
    cfg = load_config(EXAMPLE, ["topology.hbm_gib=40", "tables[1].dim=64", "tables.2.pooling_factor=7",
                                "tables[0].sharding_types=[row_wise]"])
    assert cfg.topology.hbm_gib == 40
    assert cfg.tables[1].dim == 64 and cfg.tables[2].pooling_factor == 7
    assert cfg.tables[0].sharding_types == ["row_wise"]


@pytest.mark.parametrize("override,match", [
    ("tables[3].dim=6", r"tables\[3\]\.dim: must be a positive multiple of 4"),
    ("tables[3].dim=abc", r"tables\[3\]\.dim"),
    ("tables[2].dtype=fp8", r"tables\[2\]\.dtype: 'fp8' is not one of \['fp32', 'fp16', 'bf16'\]"),
    ("tables[0].sharding_types=[diagonal]", r"tables\[0\]\.sharding_types\[0\]: 'diagonal' is not one of .*row_wise"),
    ("tables[0].placement=disk", r"tables\[0\]\.placement: 'disk' is not one of \['auto', 'device', 'cached'\]"),
    ("tables[0].cache_rows=10", r"tables\[0\]\.cache_rows / cache_load_factor: set, but placement is 'device'"),
    ("tables[10].cache_policy=fifo", r"tables\[10\]\.cache_policy: 'fifo' is not one of \['lru', 'lfu', 'lookahead'\]"),
    ("tables[0].optimizer.type=rmsprop", r"tables\[0\]\.optimizer\.type: 'rmsprop' is not one of"),
    ("tables[0].optimizer.beta1=2", r"tables\[0\]\.optimizer.*beta1"),
    ("tables[0].column_shard_width=6", r"tables\[0\]\.column_shard_width"),
    ("tables[0].pooling_factor=0", r"tables\[0\]\.pooling_factor: must be a finite number > 0"),
    ("tables[1].name=user_id", r"tables\[1\]\.name: 'user_id' already used by tables\[0\]"),
    ("tables[0].colour=red", r"tables\[0\]\.colour"),
    ("topology.world_size=7", r"topology\.world_size: 7 is not a multiple of local_world_size 4"),
    ("topology.inter_node_bandwidth_gbps=-1", r"topology\.inter_node_bandwidth_gbps: must be > 0"),
    ("topology.memory_headroom=1.5", r"topology\.memory_headroom"),
    ("nonsense", r"expected key=value"),
])
def test_validation_errors_name_the_field(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(EXAMPLE, [override])


def test_unknown_section_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown sections \['modle'\]; valid: \['tables', 'topology', 'model', 'data', 'optim', 'sharding', 'train', 'mlperf', 'parallel', 'async_train'\]"):
        config_from_dict({"tables": [], "modle": {}})
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "tables: [\n"))
    with pytest.raises(ConfigError, match="tables: expected a list"):
        config_from_dict({"tables": {"a": 1}})


def test_heterogeneous_devices_to_topology():
    cfg = config_from_dict({"tables": [], "topology": {"world_size": 4, "local_world_size": 2, "hbm_gib": 10,
                                                      "devices": [{"ranks": [3], "speed": 0.5, "hbm_gib": 5}]}})
    topo = cfg.topology.to_topology()
    assert [d.speed for d in topo.devices] == [1.0, 1.0, 1.0, 0.5]
    assert topo.devices[3].hbm_bytes == 5 * 2**30 and topo.devices[0].hbm_bytes == 10 * 2**30
    assert cfg.topology.to_topology(8, 4).world_size == 8
    with pytest.raises(ConfigError, match=r"topology.devices\[0\].ranks: \[9\] out of range"):
        config_from_dict({"topology": {"world_size": 4, "local_world_size": 2, "devices": [{"ranks": [9]}]}})


def test_cost_constants_from_a_file_then_topology_fields(tmp_path):
    calib = tmp_path / "calib.json"
    calib.write_text('{"device_kind": "cpu", "update_id_s": 3e-9, "inter_bw": 1e9}')
    cfg = config_from_dict({"sharding": {"cost_constants": str(calib)},
                            "topology": {"inter_node_bandwidth_gbps": 50}})
    c, what = cfg.cost_constants(2)
    assert c.update_id_s == 3e-9 and c.inter_bw == 50e9 and what.startswith(f"file {calib}")
    old = config_from_dict({"topology": {"cost_constants": str(calib)}})          # the old spelling
    assert old.cost_constants(1)[0].update_id_s == 3e-9
    bad = config_from_dict({"sharding": {"cost_constants": str(tmp_path / "missing.json")}})
    with pytest.raises(ConfigError, match="sharding.cost_constants: cannot use .*missing.json"):
        bad.cost_constants(1)


def test_sharding_types_section_constrains_the_plan():
    """`sharding.types` pins a table's type for `neo plan` and `neo train` alike."""
    from neo.planner import plan_tables

    cfg = config_from_dict({"tables": [{"name": "a", "num_rows": 100, "dim": 16}, {"name": "b", "num_rows": 100, "dim": 16}],
                            "topology": {"world_size": 2, "local_world_size": 2},
                            "sharding": {"types": {"a": "row_wise", "b": "column_wise"}}})
    specs = cfg.table_specs()
    plan = plan_tables(specs, cfg.topology.to_topology(), cfg.cost_constants(2)[0])
    types = {name: t["sharding_type"] for name, t in plan.to_dict()["tables"].items()}
    assert types == {"a": "row_wise", "b": "column_wise"}


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(ConfigError, match=r"tables\[0\]\.dimm: unknown key; valid keys: \['name', 'num_rows', 'dim'"):
        config_from_dict({"tables": [{"name": "a", "num_rows": 3, "dim": 4, "dimm": 8}]})
    with pytest.raises(ConfigError, match=r"topology\.hbm: unknown key; valid keys: \[.*'hbm_gib'"):
        config_from_dict({"tables": [], "topology": {"hbm": 3}})


def test_large_configs_load_typed_and_errors_still_name_table_and_field():
    from neo.config import config_from_dict
    from neo.planner.workloads import production_like_config

    data = production_like_config(1000)
    cfg = config_from_dict(data, ["tables[7].dim=64", "tables.8.pooling_factor=2"])
    assert len(cfg.tables) == 1000 and cfg.tables[7].dim == 64 and cfg.tables[8].pooling_factor == 2.0
    assert isinstance(cfg.tables[5].optimizer.lr, float) and cfg.tables[5].optimizer.type == "rowwise_adagrad"
    for override, match in [("tables[999].dim=6", r"tables\[999\]\.dim: must be a positive multiple of 4"),
                            ("tables[998].dim=abc", r"tables\[998\]\.dim: Value 'abc' of type 'str' could not be "
                                                    r"converted to Integer"),
                            ("tables[997].num_rows=1.5", r"tables\[997\]\.num_rows: Value 1\.5"),
                            ("tables[996].colour=red", r"tables\[996\]\.colour: unknown key; valid keys: \['name', "),
                            ("tables[995].optimizer.lr=fast", r"tables\[995\]\.optimizer\.lr: Value 'fast'"),
                            ("tables[1000].dim=8", r"override 'tables\[1000\]\.dim=8': index 1000 out of range|no 1000"),
                            ("tables[994].feature_names=x", r"tables\[994\]\.feature_names: expected a list")]:
        with pytest.raises(ConfigError, match=match):
            config_from_dict(data, [override])


def test_weight_dtype_maxima_are_torchs():
    torch = pytest.importorskip("torch")
    for d in WeightDType:
        assert d.max_value == float(torch.finfo(d.torch_dtype).max), d


def test_neo_plan_loads_and_plans_without_importing_torch(tmp_path):
    """``neo plan`` on a 1,000-table config took 5-8 s where importing torch for a dtype's
    largest value (the config's init_scale check) took 1.5-2 s of it: the planner path stays
    free of torch."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from neo.commands.plan import main\n"
            f"assert main([{EXAMPLE!r}, '--max-tables', '1']) == 0\n"
            "print('torch' in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False []", out.stdout[-500:]
