"""Helpers of the data pipeline tests (a uniquely named module: test directories share sys.path)."""

from __future__ import annotations

import math
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
SHARED = os.path.normpath(os.path.join(REPO, "..", "shared", "data"))


def shared_file(name: str) -> str:
    """Path of a reference file; FAILS (never skips) when the reference data is missing."""
    path = os.path.join(SHARED, name)
    if not os.path.exists(path):
        pytest.fail(f"reference data missing: {path} (clone the repository with shared/ beside it: "
                    f"<repo root>/../shared/data)", pytrace=False)
    return path


def py_parse(line: bytes):
    """Independent plain-Python parse of one raw Criteo line: (label, dense transformed, ids)."""
    fields = line.decode().split("\t")
    assert len(fields) == 40
    label = int(fields[0])
    dense = [math.log(max(int(x), 0) + 1) if x else 0.0 for x in fields[1:14]]
    ids = [int(x, 16) if x else 0 for x in fields[14:]]
    return label, dense, ids
