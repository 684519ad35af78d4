"""Fixtures of the WSP tests: one synthetic data cache for the module."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def wsp_synthetic_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("wsp-synthetic-cache"))


@pytest.fixture(scope="module")
def tmp_data(tmp_path_factory, wsp_synthetic_cache) -> str:
    """A module's own run folder whose ``cache`` is the session's data cache."""
    path = tmp_path_factory.mktemp("wsp")
    os.symlink(wsp_synthetic_cache, path / "cache")
    return str(path)
