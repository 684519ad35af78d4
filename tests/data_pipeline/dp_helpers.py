"""Helpers of the data pipeline tests (a uniquely named module: test directories share sys.path)."""

from __future__ import annotations

import math
import os
import sys


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from data_pipeline.samples import sample_path  # noqa: E402  (the reference data inside the repository)


def py_parse(line: bytes):
    """Independent plain-Python parse of one raw Criteo line: (label, dense transformed, ids)."""
    fields = line.decode().split("\t")
    assert len(fields) == 40
    label = int(fields[0])
    dense = [math.log(max(int(x), 0) + 1) if x else 0.0 for x in fields[1:14]]
    ids = [int(x, 16) if x else 0 for x in fields[14:]]
    return label, dense, ids
