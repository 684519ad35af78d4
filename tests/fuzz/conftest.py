"""Hypothesis settings of the bad-input fuzz tests (issue 17, item 5).

Profile ``neo-fuzz`` (the default): derandomized, so CI sees the same examples on every run;
no deadline (a 2-core machine shared with other work times unevenly); no example database,
and Hypothesis's own storage (its unicode tables) in the suite's cache directory (tests/conftest.py),
so nothing is written under the repository; a modest number of examples per property, so the
whole directory runs in well under a minute.

``HYPOTHESIS_PROFILE=neo-fuzz-deep`` explores further (random seeds, 20x the examples): run it
locally after changing a parser or a validator; every failure it finds prints a
``@reproduce_failure`` blob and belongs in a test here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # Else `.hypothesis/` in the working directory: the repository root under CI. At configure
    # time, after tests/conftest.py's hook has pointed XDG_CACHE_HOME at the run's own folder
    # (this module is imported before it runs when tests/fuzz is named on the command line).
    set_hypothesis_home_dir(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hypothesis")


_COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

settings.register_profile("neo-fuzz", derandomize=True, max_examples=60, **_COMMON)
settings.register_profile("neo-fuzz-deep", derandomize=False, max_examples=1200, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "neo-fuzz"))
