"""Typed configuration dataclasses: loading, validation and overrides."""

from neo.config.embedding import (  # noqa: F401
    ConfigError,
    OptimizerConfig,
    OptimizerType,
    PoolingMode,
    TableConfig,
    WeightDType,
)
