"""Suite-wide test settings: the ``multiprocess`` marker.

Every test in a module that uses the shared multi-process helper (``tests.multiprocess``) or
launches ``torchrun`` is marked ``multiprocess``: they take most of the suite's time, so a quick
loop while editing can leave them out (``pytest -m "not multiprocess"``) and CI runs everything in
one pass.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.multiprocess import run_multiprocess


def pytest_configure(config: pytest.Config) -> None:
    # The planner reads this machine's calibration from the user's cache directory; the suite
    # (and the ranks and torchrun it starts, which inherit the environment) must see a fresh
    # machine's defaults, not whatever ``neo calibrate`` left on the developer's machine.
    config._neo_cache_dir = tempfile.mkdtemp(prefix="neo-test-cache-")
    os.environ["XDG_CACHE_HOME"] = config._neo_cache_dir
    config.addinivalue_line("markers", "multiprocess: spawns gloo ranks or torchrun (most of the suite's time)")


def pytest_unconfigure(config: pytest.Config) -> None:
    # The cache directory is the suite's own: removed when the run ends, not left in /tmp.
    cache_dir = getattr(config, "_neo_cache_dir", None)
    if cache_dir is not None:
        shutil.rmtree(cache_dir, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "run_multiprocess", None) is run_multiprocess:
            item.add_marker(pytest.mark.multiprocess)
