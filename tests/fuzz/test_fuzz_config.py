"""Bad configs, fuzzed, through the loader of ``neo train`` / ``neo plan`` (issue 17, item 5).

A valid base config (every section set, a cached table, a device group, ``optim.sparse``) gets
one mutation: a real key set to a random value (wrong types, None, NaN, infinities, negative
and huge numbers, lists, mappings, random strings, valid choice words), an unknown key added,
a section replaced, a key removed. Applied to the mapping, as a dotted override ``a.b=c``, or
as YAML text. Property: a config that passes is sane (no NaN, integers fit 64 bits, it converts
to the module's and the planner's table types); one that fails raises :class:`ConfigError`
whose message names the key that was changed. Anything else (TypeError, OverflowError,
yaml's errors, OmegaConf's...) is a bug.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import math
import typing
import warnings
from typing import Any, List, Tuple
from unittest import mock

import pytest
import yaml
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from neo.config import ConfigError, NeoConfig, config_from_dict, load_config
from neo.train.build import validate_training_config

BASE = {
    "tables": [
        {"name": "user", "num_rows": 100, "dim": 8, "optimizer": {"type": "adagrad", "lr": 0.1},
         "sharding_types": ["table_wise", "row_wise"], "ranks": [0]},
        {"name": "item", "num_rows": 50, "dim": 8, "feature_names": ["item", "item_hist"],
         "placement": "cached", "cache_rows": 10, "cache_policy": "lru", "dtype": "fp16"},
    ],
    "topology": {"world_size": 2, "local_world_size": 2, "hbm_gib": 1.0,
                 "devices": [{"ranks": [1], "speed": 0.5}]},
    "model": {"interaction": "dot", "dense_arch": [16, 8], "over_arch": [16, 1]},
    "data": {"source": "synthetic", "synthetic": {"num_samples": 4096, "val_samples": 1024, "num_dense": 4}},
    "optim": {"type": "adam", "lr": 0.01, "betas": [0.9, 0.99], "sparse": {"type": "sgd", "lr": 0.05}},
    "sharding": {"planner": "auto", "types": {"user": "table_wise"}},
    "train": {"batch_size": 64, "steps": 10, "run_dir": "runs/fuzz"},
}
SECTIONS = [f.name for f in dataclasses.fields(NeoConfig)]
INT64 = (-(2**63), 2**63 - 1)


# ----------------------------------------------------------------------------- the real keys
def _leaves(tp: Any, path: Tuple, depth: int = 0) -> List[Tuple[Tuple, Any]]:
    """(path, type) of every field under dataclass type ``tp``; list items at index 0 (tables: 0, 1)."""
    out = []
    for f in dataclasses.fields(tp):
        ftp = typing.get_type_hints(tp)[f.name]
        p = path + (f.name,)
        out.append((p, ftp))
        inner = [a for a in typing.get_args(ftp) if a is not type(None)] or [ftp]
        if typing.get_origin(ftp) in (list, List) and dataclasses.is_dataclass(inner[0]):
            for k in ((0, 1) if f.name == "tables" else (0,)):
                out += _leaves(inner[0], p + (k,), depth + 1)
        elif dataclasses.is_dataclass(inner[0]):
            out += _leaves(inner[0], p, depth + 1)
    return out


LEAVES = _leaves(NeoConfig, ())
DICT_PATHS = [()] + [p for p, tp in LEAVES if typing.get_origin(tp) not in (list, List) and dataclasses.is_dataclass(
    ([a for a in typing.get_args(tp) if a is not type(None)] or [tp])[0])] + [
    p + (k,) for p, tp in LEAVES if typing.get_origin(tp) in (list, List) and p in (("tables",), ("topology", "devices"))
    for k in ((0, 1) if p == ("tables",) else (0,))]

CHOICES = ["sum", "mean", "fp32", "fp16", "bf16", "sgd", "adagrad", "rowwise_adagrad", "adam", "lamb",
           "data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise",
           "auto", "device", "cached", "lru", "lfu", "lookahead", "host", "mmap", "dot", "dcn", "synthetic",
           "parquet", "uniform", "zipf", "explicit", "gloo", "nccl", "cpu", "cuda", "reference", "triton",
           "fbgemm", "h100", "h200", "user", "item", "item_hist", "FP16", "Row_Wise"]
HUGE = [2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63), -(2**63) - 1, -(10**30)]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70), st.sampled_from(HUGE),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324]),
                    st.text(max_size=6), st.sampled_from(CHOICES), st.sampled_from(["1", "-1", "1e3", "nan", "inf", "yes", "null", "${x}", "???"]))
junk = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), scalars, max_size=2))


def _values_for(tp: Any) -> st.SearchStrategy:
    """Plausible values of a field's type (and some junk: its type is often wrong)."""
    inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    base = inner[0] if typing.get_origin(tp) is typing.Union else tp
    origin = typing.get_origin(base)
    if base is int:
        plausible = st.one_of(st.integers(-3, 70), st.sampled_from(HUGE))
    elif base is float:
        plausible = st.floats(allow_nan=True, allow_infinity=True)
    elif base is bool:
        plausible = st.one_of(st.booleans(), st.sampled_from(["yes", "off", "1", 2]))
    elif base is str:
        plausible = st.one_of(st.sampled_from(CHOICES), st.text(max_size=6))
    elif origin in (list, List):
        (elem,) = typing.get_args(base)
        plausible = st.lists(_values_for(elem) if not dataclasses.is_dataclass(elem) else junk, max_size=4)
    elif origin in (dict, typing.Dict):
        plausible = st.dictionaries(st.sampled_from(["user", "item", "nope", "1"]), st.sampled_from(CHOICES) | scalars, max_size=3)
    else:
        plausible = junk
    return st.one_of(plausible, junk)


# ----------------------------------------------------------------------------- mutations
def _get(d: Any, path: Tuple) -> Any:
    for p in path:
        d = d[p]
    return d


def _set(d: dict, path: Tuple, value: Any) -> None:
    """``d[path] = value``, making the missing containers on the way: a list where the next
    step is an index (``slowdown[0].rank`` on a config without ``slowdown``), else a mapping."""
    node = d
    for p, nxt in zip(path[:-1], path[1:]):
        if isinstance(node, dict) and node.get(p) is None:
            node[p] = [{} for _ in range(nxt + 1)] if isinstance(nxt, int) else {}
        node = node[p]
    node[path[-1]] = value


def _token(path: Tuple, before: Any = None) -> Tuple[str, ...]:
    """What a message must name (one of): the last mapping key of ``path``, or the name the
    key held before (a renamed table is named by what still refers to its old name)."""
    key = str([p for p in path if not isinstance(p, int)][-1])
    return (key, before) if isinstance(before, str) and len(before) >= 3 else (key,)


def _dotted(path: Tuple, brackets: bool) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]" if brackets else f".{p}"
        else:
            out += ("." if out else "") + p
    return out


@st.composite
def mutations(draw):
    """(mutated config, the same mutation as an override or None, the key its error must name)."""
    data = copy.deepcopy(BASE)
    kind = draw(st.sampled_from(["set", "set", "set", "unknown", "section", "delete"]))
    if kind == "set":
        path, tp = draw(st.sampled_from(LEAVES))
        value = draw(_values_for(tp))
        before = _get(data, path) if _has(data, path) else None
        _set(data, path, value)
        return data, (path, value), _token(path, before)
    if kind == "unknown":
        path = draw(st.sampled_from(DICT_PATHS))
        key = draw(st.one_of(st.text(min_size=1, max_size=8), st.sampled_from(["modle", "dimm", "lr ", "Name", 0, None])))
        node = _get(data, path) if _has(data, path) else None
        if not isinstance(node, dict):          # e.g. tables[1].optimizer, absent from BASE
            node = {}
            _set(data, path, node)
        assume(key not in node and not (path == () and key in SECTIONS)
               and not (path and path[-1] in ("types",)))
        value = draw(junk)
        node[key] = value
        ident = isinstance(key, str) and key.isidentifier()
        return data, ((path + (key,), value) if ident else None), (str(key),)
    if kind == "section":
        section = draw(st.sampled_from(SECTIONS))
        value = draw(junk)
        data[section] = value
        return data, ((section,), value), (section,)
    path, _ = draw(st.sampled_from([(p, t) for p, t in LEAVES if _has(data, p)]))
    parent = _get(data, path[:-1])
    before = parent.pop(path[-1])
    return data, None, _token(path, before)


def _has(d: Any, path: Tuple) -> bool:
    try:
        _get(d, path)
        return True
    except (KeyError, IndexError, TypeError):
        return False


# ----------------------------------------------------------------------------- the property
def _assert_sane(cfg: NeoConfig) -> None:
    """A config that loaded has no NaN, integers that fit 64 bits, and converts to the
    module's and the planner's table types."""
    def walk(obj, where):
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name), f"{where}.{f.name}")
        elif isinstance(obj, (list, tuple)):
            for k, v in enumerate(obj):
                walk(v, f"{where}[{k}]")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}.{k}")
        elif isinstance(obj, float):
            assert not math.isnan(obj), f"{where} is NaN in a config that loaded"
        elif isinstance(obj, int) and not isinstance(obj, bool):
            assert INT64[0] <= obj <= INT64[1], f"{where} = {obj} does not fit 64 bits"
    walk(cfg, "config")
    cfg.table_configs()
    cfg.table_specs()
    if cfg.topology.world_size and cfg.topology.local_world_size:
        cfg.topology.to_topology()


def load(data: Any, overrides=()) -> str | None:
    """None when the config loads and passes ``neo train``'s checks, else the ConfigError's message."""
    try:
        cfg = config_from_dict(data, overrides)
        validate_training_config(cfg)
    except ConfigError as e:
        return str(e)
    _assert_sane(cfg)
    return None


def _names(msg: str, tokens) -> bool:
    """``msg`` names one of ``tokens`` (as is, or escaped as repr writes it)."""
    tokens = (tokens,) if isinstance(tokens, str) else tokens
    return any(t in msg or repr(t) in msg or repr(t)[1:-1] in msg for t in tokens)


def test_base_config_is_valid(tmp_path_factory):
    assert load(BASE) is None
    assert _cli(["plan", _write(tmp_path_factory, BASE)]) == (0, "")


@given(mutations())
@example((dict(BASE, optim=dict(BASE["optim"], sparse=5)), None, ("sparse",)))
@example((dict(BASE, topology=dict(BASE["topology"], devices=[{"ranks": "x"}])), None, ("ranks",)))
@example((dict(BASE, topology=dict(BASE["topology"], devices={"a": 1})), None, ("devices",)))
@example((dict(BASE, train=dict(BASE["train"], target_auc_delta=math.nan)), None, ("target_auc_delta",)))
@example((dict(BASE, tables=[dict(BASE["tables"][0], num_rows=2**70), BASE["tables"][1]]), None, ("num_rows",)))
@example((dict(BASE, tables=[dict(BASE["tables"][0], init_scale=math.nan), BASE["tables"][1]]), None, ("init_scale",)))
@example((dict(BASE, tables=[dict(BASE["tables"][0], pooling_factor=10**400), BASE["tables"][1]]), None,
          ("pooling_factor",)))
@example((dict(BASE, topology=dict(BASE["topology"], world_size=2**62)), None, ("world_size",)))
@example((dict(BASE, topology=dict(BASE["topology"], hbm_gib=1e300)), None, ("hbm_gib",)))
@example((dict(BASE, topology=dict(BASE["topology"], devices=[{"ranks": [1], "host_gib": math.inf}])), None,
          ("host_gib",)))
def test_mutated_config_loads_sane_or_names_the_key(case):
    data, _, token = case
    msg = load(data)
    if msg is not None:
        assert _names(msg, token), f"ConfigError does not name {token!r}: {msg}"


@given(mutations(), st.booleans())
def test_the_same_mutation_as_a_dotted_override(case, brackets):
    data, as_override, token = case
    assume(as_override is not None)
    path, value = as_override
    assume(not isinstance(value, dict))                 # an override merges a mapping into a mapping
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text[:-4].strip() if text.endswith("\n...") or text.endswith(" ...") else text
    direct = load(data)
    over = load(BASE, [f"{_dotted(path, brackets)}={text}"])
    assert (direct is None) == (over is None), f"direct: {direct!r}; override: {over!r}"
    if over is not None:
        assert _names(over, token), f"ConfigError does not name {token!r}: {over}"


override_text = st.one_of(
    st.text(max_size=20),
    st.tuples(st.sampled_from([_dotted(p, b) for p, _ in LEAVES for b in (False, True)] + ["", ".", "[0]", "tables[9]",
                                                                                          "model..dense_arch", "a.b.c"]),
              st.sampled_from(["=", "=", " = ", "==", ""]),
              st.one_of(st.text(max_size=12), st.sampled_from(["[", "{a: 1", "!!python/object:os.system x", "*a",
                                                               "&a [*a]", ".nan", "-.inf", "0x10", "1_000", "~", "'", "\t"])))
    .map("".join))


@given(st.lists(override_text, min_size=1, max_size=3))
def test_random_overrides_load_or_raise_config_error(overrides):
    for ov in overrides:
        msg = load(BASE, [ov])
        if msg is not None:
            key = ov.split("=", 1)[0].strip()
            first = key.split(".")[0].split("[")[0]
            assert _names(msg, ov) or _names(msg, first) or key == "" or "=" not in ov, \
                f"override {ov!r}: ConfigError names neither the override nor its section: {msg}"


yaml_text = st.one_of(
    st.text(max_size=60),
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["tables: [\n", "a: &a [*a]\n", "model: &m {dense_arch: *m}\n", "tables: &t [*t]\n",
                     "? [a, b]\n: 1\n", "model:\n  dense_arch: !!binary aGVsbG8=\n", "%YAML 1.1\n---\n",
                     "--- 1\n--- 2\n", "model: {interaction: dot, interaction: dcn}\n", "[" * 2000 + "]" * 2000,
                     "train: {batch_size: 1e3}\n", "train: {batch_size: 0x40}\n", "train: {batch_size: 1_000}\n"]))


@given(yaml_text)
def test_yaml_text_loads_or_raises_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        cfg = load_config(str(path))
    except ConfigError as e:
        assert str(path) in str(e) or "config" in str(e) or ":" in str(e)
    else:
        _assert_sane(cfg)


@given(st.binary(max_size=40))
def test_undecodable_yaml_raises_config_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_bytes(b"tables: []\n# " + raw + b"\xff\xfe\n")
    with pytest.raises(ConfigError, match="c.yaml"):
        load_config(str(path))


@settings(max_examples=max(10, settings.default.max_examples // 3))
@given(mutations())
def test_yaml_of_the_mutated_config_matches_the_mapping(tmp_path_factory, case):
    data, _, token = case
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        assume(False)
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(text)
    direct = load(data)
    try:
        cfg = load_config(str(path))
        validate_training_config(cfg)
        from_file = None
    except ConfigError as e:
        from_file = str(e)
    assert (direct is None) == (from_file is None), f"mapping: {direct!r}; YAML file: {from_file!r}"


# ----------------------------------------------------------------------------- the commands
def _cli(argv: List[str]) -> Tuple[int, str]:
    """(exit status, stderr) of ``neo ARGV``; argparse's usage errors count as status 2."""
    from neo.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            rc = main(argv)
        except SystemExit as e:          # argparse: "usage: ... error: ..." and status 2
            rc = e.code
    return rc, err.getvalue()


def _write(tmp_path_factory, data: Any) -> str:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return str(path)


@settings(max_examples=max(10, settings.default.max_examples // 3))
@given(mutations())
@example((dict(BASE, topology=dict(BASE["topology"], hbm_gib=1e300)), None, ("hbm_gib",)))
@example((dict(BASE, topology=dict(BASE["topology"], world_size=2**62)), None, ("world_size",)))
@example((dict(BASE, tables=[dict(BASE["tables"][0], num_rows=2**62), BASE["tables"][1]]), None, ("num_rows",)))
def test_neo_plan_exits_0_or_2_naming_the_key(tmp_path_factory, case):
    data, _, token = case
    try:
        path = _write(tmp_path_factory, data)
    except yaml.YAMLError:
        assume(False)
    rc, err = _cli(["plan", path])
    assert rc in (0, 2), err
    if rc == 2:
        # a ConfigError names the key; a PlanningError (no plan exists) the table or the memory
        assert err.startswith("neo plan: error: ") and (
            _names(err, token) or "table '" in err or "plan fits device memory" in err), err


plan_args = st.lists(st.one_of(
    st.tuples(st.sampled_from(["--world-size", "--local-world-size", "--max-tables"]),
              st.one_of(st.integers(-3, 9).map(str), st.sampled_from(["0", "x", "", "1e3", str(2**62), str(2**70)]))),
    st.tuples(st.just("--simulate"), st.one_of(st.sampled_from(["0", "-2", "x", "", ",", "2,", "1,2", "4," * 3, str(2**40)]),
                                               st.lists(st.integers(-2, 16), min_size=1, max_size=3)
                                               .map(lambda ws: ",".join(map(str, ws))))),
    st.tuples(st.sampled_from(["--partitioner", "--strong", "--json"]), st.sampled_from(["auto", "lpt", "bogus"]))),
    max_size=3)


@settings(max_examples=max(10, settings.default.max_examples // 3))
@given(plan_args)
@example([("--simulate", "0")])
@example([("--simulate", "x")])
@example([("--world-size", "0")])
def test_neo_plan_arguments_exit_0_or_2(tmp_path_factory, args):
    argv = ["plan", _write(tmp_path_factory, BASE)]
    for flag, value in args:
        argv += [flag] if flag in ("--strong", "--json") else [flag, value]
    rc, err = _cli(argv)
    assert rc in (0, 2), err
    if rc == 2:
        assert "error:" in err, err


@settings(max_examples=max(10, settings.default.max_examples // 3))
@given(mutations(), st.lists(override_text, max_size=2))
def test_neo_train_config_errors_exit_2_naming_the_key(tmp_path_factory, case, overrides):
    """``neo train``'s checks up to the training itself (``run`` stubbed: no data, no model)."""
    import neo.commands.train as train_cmd

    data, _, token = case
    try:
        path = _write(tmp_path_factory, data)
    except yaml.YAMLError:
        assume(False)
    seen = []
    with mock.patch.object(train_cmd, "run", lambda cfg: seen.append(cfg) or 0):
        rc, err = _cli(["train", path, *[ov for ov in overrides if not ov.startswith("-")]])
    assert rc in (0, 2), err
    if rc == 0:
        _assert_sane(seen[0])
    elif not overrides:
        assert err.startswith("neo train: error: ") and _names(err, token), err
