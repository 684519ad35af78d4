"""Fixtures of the training tests: one synthetic data cache for the whole session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def synthetic_cache(tmp_path_factory) -> str:
    """Generated once: every training test reads the tiny config's data from here."""
    return str(tmp_path_factory.mktemp("synthetic-cache"))


@pytest.fixture(scope="module")
def tmp_data(tmp_path_factory, synthetic_cache) -> str:
    """A module's own run/checkpoint folder whose ``cache`` is the session's data cache."""
    path = tmp_path_factory.mktemp("train")
    os.symlink(synthetic_cache, path / "cache")
    return str(path)
