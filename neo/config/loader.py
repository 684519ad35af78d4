"""Neo's YAML config: the top-level :class:`NeoConfig` and :func:`load_config`.

Each top-level section is one field of :class:`NeoConfig` whose type is a dataclass (or a
list of dataclasses). Adding a section (``model``, ``data``, ``train``) is adding a field;
the loader iterates over the fields, types each section with :mod:`neo.config.typed`
(OmegaConf's conversion rules, errors naming the full field path such as
``topology.devices[0].ranks``; 1,000 tables load in a fraction of a second) and calls the
section's ``validate(where)`` when it has one.

YAML anchors, aliases and merge keys work (``- &base {num_rows: 1000, dim: 16, name: t0}``,
then ``- {<<: *base, name: t1}``); an anchor goes on a value of a known section, as unknown
top-level sections are refused.

Dotted overrides (``topology.hbm_gib=40``, ``tables[2].dim=64``, ``tables.2.dim=64``) are
applied to the YAML before validation; values are parsed as YAML scalars. Every failure,
whatever the input (bad YAML, text that is not UTF-8, wrong types, NaN, integers beyond 64
bits), is a :class:`ConfigError` naming the file, the override or the field.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from neo.config.async_train import AsyncTrainConfig
from neo.config.embedding import ConfigError
from neo.config.data import DataConfig
from neo.config.mlperf import MLPerfConfig
from neo.config.model import ModelConfig
from neo.config.parallel import ParallelConfig
from neo.config.tables import OptimizerEntry, TableEntry
from neo.config.topology import TopologyConfig
from neo.config.train import OptimConfig, ShardingConfig, TrainConfig
from neo.config.typed import build_dataclass

_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)    # libyaml's parser where pyyaml has it


class _YAML_LOADER(_BASE_LOADER):
    """The safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one
    silently: a second ``train:`` section would replace the first whole). Merge keys
    (``<<: *base``, ``<<: [*a, *b]``) are YAML 1.1's, as PyYAML reads them: the mapping's own keys
    replace merged ones."""

    def flatten_mapping(self, node):
        """Merge the ``<<`` keys of ``node`` into it (the base class, which every mapping's
        construction calls), after refusing a key the mapping itself gives twice; then one pair
        per key, the one that wins, so that merges of merges stay the size of their keys (PyYAML
        before its merge-key fix appends every merged pair: 9 levels of 9 aliases, 9^9 pairs)."""
        first: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            try:
                hash(key)
            except TypeError:
                continue                                   # the base class reports unhashable keys
            if key in first:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {first[key] + 1})", key_node.start_mark)
            first[key] = key_node.start_mark.line
        super().flatten_mapping(node)
        pairs: Dict[Any, Any] = {}
        for pair in node.value:                            # the first place of a key, its last (winning) pair
            key = self.construct_object(pair[0])
            try:
                pairs[key] = pair
            except TypeError:
                pairs[object()] = pair                     # unhashable: kept for the base class to report
        node.value = list(pairs.values())


__all__ = ["NeoConfig", "load_config", "config_from_dict", "apply_overrides"]


@dataclass
class NeoConfig:
    """The whole config file; one field per top-level YAML section."""

    tables: List[TableEntry] = field(default_factory=list)
    """Embedding tables (see :class:`neo.config.tables.TableEntry`)."""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    """Cluster the tables are planned for (see :class:`neo.config.topology.TopologyConfig`)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """``neo train``: DLRM / DCNv2 architecture (see :class:`neo.config.model.ModelConfig`)."""
    data: DataConfig = field(default_factory=DataConfig)
    """``neo train``: synthetic or Parquet data (see :class:`neo.config.data.DataConfig`)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """``neo train``: dense optimizer and LR schedule (see :class:`neo.config.train.OptimConfig`)."""
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    """``neo train``: planner mode and pinned sharding types (see :class:`neo.config.train.ShardingConfig`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """``neo train``: batch, length, cadences, checkpoints (see :class:`neo.config.train.TrainConfig`)."""
    mlperf: MLPerfConfig = field(default_factory=MLPerfConfig)
    """``neo mlperf``: target AUC, evaluation cadence, submission fields (see
    :class:`neo.config.mlperf.MLPerfConfig`)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """``neo train``: pipeline-parallel dense towers (see :class:`neo.config.parallel.ParallelConfig`)."""
    async_train: AsyncTrainConfig = field(default_factory=AsyncTrainConfig)
    """``neo train``: synchronous or wave-synchronous (bounded staleness) workers (see
    :class:`neo.config.async_train.AsyncTrainConfig`)."""

    def validate(self) -> None:
        """Validate every section (its ``validate(where)``), then cross-section rules."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            items = enumerate(value) if isinstance(value, list) else [(None, value)]
            for k, item in items:
                if hasattr(item, "validate"):
                    item.validate(f.name if k is None else f"{f.name}[{k}]")
        seen: Dict[str, int] = {}
        feats: Dict[str, str] = {}
        for k, t in enumerate(self.tables):
            where = f"tables[{k}]"
            if t.name in seen:
                raise ConfigError(f"{where}.name: {t.name!r} already used by tables[{seen[t.name]}]")
            seen[t.name] = k
            for f in (t.feature_names or [t.name]):
                if f in feats:
                    raise ConfigError(f"{where}.feature_names: feature {f!r} already reads table {feats[f]!r}")
                feats[f] = t.name

    def cost_constants(self, world_size: int = 1):
        """(the planner's cost constants for ``world_size`` ranks, what they are): see
        :meth:`neo.config.topology.TopologyConfig.to_cost_constants`."""
        return self.topology.to_cost_constants(world_size, path=self.sharding.cost_constants)

    def dense_spec(self, num_dense: Optional[int] = None):
        """The planner's :class:`neo.planner.step_model.DenseSpec` of the model, or None when the
        tables' dims differ (no DLRM). ``num_dense``: the data's dense features (default: the
        synthetic data's)."""
        from neo.planner.step_model import DenseSpec

        dims = {t.dim for t in self.tables}
        if len(dims) != 1:
            return None
        m, opt = self.model, self.optim
        state = {"sgd": 1 if opt.momentum else 0, "adagrad": 1, "adam": 2}.get(opt.type, 1)
        features = sum(len(t.feature_names) or 1 for t in self.tables)
        return DenseSpec(num_dense or self.data.synthetic.num_dense, tuple(int(x) for x in m.dense_arch),
                         tuple(int(x) for x in m.over_arch), features, dims.pop(), m.interaction,
                         int(m.dcn_layers), int(m.dcn_rank), state)

    def planning_batch(self) -> int:
        """Samples per rank the planner plans for: ``topology.batch_size_per_rank``, else
        ``train.batch_size`` (what ``neo train`` runs)."""
        return int(self.topology.batch_size_per_rank or self.train.batch_size)

    def table_entries(self) -> List[TableEntry]:
        """The ``tables`` section as training uses it: ``optim.sparse`` replaces every table's
        optimizer left at the default."""
        if self.optim.sparse is None:
            return list(self.tables)
        default = OptimizerEntry()
        return [replace(t, optimizer=self.optim.sparse) if t.optimizer == default else t for t in self.tables]

    def table_configs(self):
        """The embedding module's :class:`TableConfig` of every table (``optim.sparse`` applied)."""
        return [t.to_table_config(f"tables[{k}]") for k, t in enumerate(self.table_entries())]

    def table_specs(self):
        """The planner's :class:`neo.planner.TableSpec` of every table, with the optimizer state
        training keeps (``optim.sparse`` applied); a table named in ``sharding.types`` is
        constrained to that one sharding type; features with ``model.position_weights`` count as
        weighted, with learnable weights."""
        out = []
        for k, t in enumerate(self.table_entries()):
            if t.name in self.sharding.types:
                t = replace(t, sharding_types=[self.sharding.types[t.name]])
            spec = t.to_table_spec(f"tables[{k}]")
            weighted = sum(f in self.model.position_weights for f in t.to_table_config(f"tables[{k}]").feature_names)
            out.append(replace(spec, weighted_features=weighted, learnable_weights=weighted > 0) if weighted else spec)
        return out


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_PATH = re.compile(r"[^.\[\]]+(?:\[\d+\])*(?:\.[^.\[\]]+(?:\[\d+\])*)*")   # a.b, tables[2].dim, tables.2.dim


def _parse_key(key: str) -> List[Any]:
    """``tables.2.dim`` or ``tables[2].dim`` -> ``["tables", 2, "dim"]``."""
    if key and not _PATH.fullmatch(key):
        raise ConfigError(f"override key {key!r}: not a dotted path (section.key, tables[2].dim or tables.2.dim)")
    parts: List[Any] = []
    for name, index in _PATH_PART.findall(key):
        parts.append(int(index) if index else (int(name) if name.isdigit() else name))
    if not parts:
        raise ConfigError(f"override key {key!r}: empty")
    return parts


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for k, v in new.items():
            out[k] = _merge(old.get(k), v)
        return out
    return new


def _own(node: Any) -> Any:
    """A shallow copy of a mapping or list (this override's own, to change), other values as they are."""
    return dict(node) if isinstance(node, dict) else list(node) if isinstance(node, list) else node


def apply_overrides(data: Dict[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """A copy of the plain mapping ``data`` with ``key=value`` overrides applied (values parsed as
    YAML; a mapping value merges into a mapping).

    Every mapping and list on an override's path is copied before it changes, and nothing else:
    ``data`` stays as it was, and a node that YAML aliases or merge keys share between several
    places (``- {<<: *base, name: t1}``) changes in the overridden place only (a deep copy keeps
    such nodes shared; a full unsharing copy would expand an alias bomb)."""
    data = dict(data)
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key=value")
        key, value = ov.split("=", 1)
        path = _parse_key(key.strip())
        node: Any = data
        for k, part in enumerate(path[:-1]):
            nxt = path[k + 1]
            if isinstance(node, dict):
                node[part] = ([] if isinstance(nxt, int) else {}) if node.get(part) is None else _own(node[part])
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node[part] = _own(node[part])
                node = node[part]
            else:
                raise ConfigError(f"override {ov!r}: no {part!r} in {'.'.join(map(str, path[:k])) or 'config'}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"override {ov!r}: the value is not valid YAML ({first})") from None
        last = path[-1]
        if isinstance(node, dict):
            node[last] = _merge(node.get(last), parsed)
        elif isinstance(node, list) and isinstance(last, int) and 0 <= last < len(node):
            node[last] = _merge(node[last], parsed)
        else:
            raise ConfigError(f"override {ov!r}: index {last!r} out of range or not a mapping key")
    return data


def _section(tp, node: Any, where: str):
    origin = typing.get_origin(tp)
    if origin in (list, List):                 # e.g. 1,000 tables
        (elem,) = typing.get_args(tp)
        if node is None:
            return []
        if not isinstance(node, (list, ListConfig)):
            raise ConfigError(f"{where}: expected a list, got {type(node).__name__}")
        return [build_dataclass(elem, item, f"{where}[{k}]") for k, item in enumerate(node)]
    if node is None:
        return tp()
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"{where}: expected a mapping, got {type(node).__name__}")
    return build_dataclass(tp, node, where)


def config_from_dict(data: Any, overrides: Sequence[str] = ()) -> NeoConfig:
    """Build, override and validate a :class:`NeoConfig` from a mapping (e.g. parsed YAML)."""
    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data)
    data = data if data is not None else {}
    if not isinstance(data, dict):
        raise ConfigError("config: the top level must be a mapping of sections")
    raw = apply_overrides(data, overrides)
    hints = typing.get_type_hints(NeoConfig)
    names = [f.name for f in dataclasses.fields(NeoConfig)]
    unknown = [k for k in raw.keys() if k not in names]
    if unknown:
        raise ConfigError(f"config: unknown sections {unknown}; valid: {names}")
    values = {name: _section(hints[name], raw[name] if name in raw else None, name) for name in names}
    cfg = NeoConfig(**values)
    cfg.validate()
    return cfg


def load_config(path: str, overrides: Sequence[str] = ()) -> NeoConfig:
    """Read a YAML config file, apply dotted ``overrides`` and validate it."""
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_YAML_LOADER)
    except OSError as e:
        raise ConfigError(f"config {path!r}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path!r}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path!r}: invalid YAML: {e}") from None
    return config_from_dict(data, overrides)
