"""Typed configuration dataclasses: loading, validation and overrides."""

from neo.config.embedding import (  # noqa: F401
    ConfigError,
    OptimizerConfig,
    OptimizerType,
    PoolingMode,
    TableConfig,
    WeightDType,
)
from neo.config.loader import NeoConfig, apply_overrides, config_from_dict, load_config  # noqa: F401,E402
from neo.config.tables import OptimizerEntry, TableEntry  # noqa: F401,E402
from neo.config.topology import DeviceGroupEntry, TopologyConfig  # noqa: F401,E402
