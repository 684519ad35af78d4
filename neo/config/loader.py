"""Neo's YAML config: the top-level :class:`NeoConfig` and :func:`load_config`.

Each top-level section is one field of :class:`NeoConfig` whose type is a dataclass (or a
list of dataclasses). Adding a section (``model``, ``data``, ``train``) is adding a field;
the loader iterates over the fields, merges each section into its OmegaConf structured
config (type checking) and calls the section's ``validate(where)`` when it has one.

Dotted overrides (``topology.hbm_gib=40``, ``tables[2].dim=64``, ``tables.2.dim=64``) are
applied to the YAML before validation; values are parsed as YAML scalars.
"""

from __future__ import annotations

import dataclasses
import typing
import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from neo.config.embedding import ConfigError
from neo.config.data import DataConfig
from neo.config.model import ModelConfig
from neo.config.tables import TableEntry
from neo.config.topology import TopologyConfig
from neo.config.train import OptimConfig, ShardingConfig, TrainConfig

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

    def table_configs(self):
        """The embedding module's :class:`TableConfig` of every table."""
        return [t.to_table_config(f"tables[{k}]") for k, t in enumerate(self.tables)]

    def table_specs(self):
        """The planner's :class:`neo.planner.TableSpec` of every table; a table named in
        ``sharding.types`` is constrained to that one sharding type."""
        out = []
        for k, t in enumerate(self.tables):
            if t.name in self.sharding.types:
                t = replace(t, sharding_types=[self.sharding.types[t.name]])
            out.append(t.to_table_spec(f"tables[{k}]"))
        return out


def _parse_key(key: str) -> str:
    """``tables.2.dim`` -> ``tables[2].dim`` (OmegaConf's syntax for list indices)."""
    parts = key.split(".")
    out = ""
    for p in parts:
        if p.isdigit():
            out += f"[{p}]"
        else:
            out += ("." if out else "") + p
    return out


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """A copy of ``cfg`` with ``key=value`` overrides applied (values parsed as YAML)."""
    cfg = cfg.copy()
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key=value")
        key, value = ov.split("=", 1)
        try:
            OmegaConf.update(cfg, _parse_key(key.strip()), yaml.safe_load(value), merge=True)
        except (OmegaConfBaseException, IndexError, KeyError, ValueError) as e:
            raise ConfigError(f"override {ov!r}: {e}") from None
    return cfg


def _structured(cls, node: Any, where: str):
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        owner = getattr(e, "object_type", None)
        if isinstance(e, ConfigKeyError) and owner is not None and dataclasses.is_dataclass(owner):
            msg = f"unknown key; valid keys: {[f.name for f in dataclasses.fields(owner)]}"
        raise ConfigError(f"{where}{'.' + key if key else ''}: {msg}") from None


def _section(tp, node: Any, where: str):
    origin = typing.get_origin(tp)
    if origin in (list, List):
        (elem,) = typing.get_args(tp)
        if node is None:
            return []
        if not isinstance(node, (list, ListConfig)):
            raise ConfigError(f"{where}: expected a list, got {type(node).__name__}")
        return [_structured(elem, item, f"{where}[{k}]") for k, item in enumerate(node)]
    if node is None:
        return tp()
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"{where}: expected a mapping, got {type(node).__name__}")
    return _structured(tp, node, where)


def config_from_dict(data: Any, overrides: Sequence[str] = ()) -> NeoConfig:
    """Build, override and validate a :class:`NeoConfig` from a mapping (e.g. parsed YAML)."""
    raw = OmegaConf.create(data if data is not None else {})
    if not isinstance(raw, DictConfig):
        raise ConfigError("config: the top level must be a mapping of sections")
    raw = apply_overrides(raw, overrides)
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
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"config {path!r}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path!r}: invalid YAML: {e}") from None
    return config_from_dict(data, overrides)
