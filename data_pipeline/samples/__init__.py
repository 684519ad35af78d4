"""Reference data shipped with the package (see ``README.md`` here for sources and licenses).

``sample_path(name)`` is the one way code and tests find these files: they live inside the
repository (and the installed package), never beside it.
"""

from __future__ import annotations

import os

__all__ = ["SAMPLES_DIR", "CRITEO_SAMPLE", "sample_path", "locality_stats_path"]

SAMPLES_DIR = os.path.dirname(os.path.abspath(__file__))
CRITEO_SAMPLE = "criteo_kaggle_sample.tsv"


def sample_path(name: str) -> str:
    """Path of the reference file ``name``; ``FileNotFoundError`` naming the directory if absent."""
    path = os.path.join(SAMPLES_DIR, name)
    if not os.path.isfile(path):
        have = sorted(f for f in os.listdir(SAMPLES_DIR) if not f.startswith(("_", ".")))
        raise FileNotFoundError(f"reference data file {name!r} is not in {SAMPLES_DIR} (it has: {', '.join(have)})")
    return path


def locality_stats_path(year: str) -> str:
    """The production embedding-access statistics of ``year`` (2021 or 2022)."""
    return sample_path(f"dlrm_datasets_{year}_locality_stats.txt")
