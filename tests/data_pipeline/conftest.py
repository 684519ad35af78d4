"""Fixtures of the data pipeline tests: the reference data in ``data_pipeline/samples/``."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dp_helpers import sample_path  # noqa: E402  (also puts the repository root on sys.path)


@pytest.fixture
def criteo_sample() -> str:
    return sample_path("criteo_kaggle_sample.tsv")


@pytest.fixture
def sample_lines(criteo_sample: str) -> list:
    with open(criteo_sample, "rb") as f:
        return f.read().split(b"\n")[:-1]  # 200 lines, the file ends with a newline
