"""``pytest --seed-shift K``: every integer seed + K, in the suite's process and its children."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from tests.multiprocess import ROOT, child_env
from tests.seed_shift import seed_shift

_DRAWS = r"""
import random, sys
started_with_torch = 'torch' in sys.modules
import numpy as np, torch
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
print(started_with_torch, torch.initial_seed(), g.initial_seed(), isinstance(g, torch._C.Generator),
      int(np.random.default_rng(5).integers(1 << 30)), int(np.random.default_rng(None).integers(2)) >= 0,
      float(np.random.RandomState(1).rand()), isinstance(np.random.RandomState(1), np.random.mtrand.RandomState),
      random.seed(4) or random.random())
"""


def _draws(env):
    out = subprocess.run([sys.executable, "-c", _DRAWS], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    return out


def test_a_shifted_process_draws_what_the_shifted_seeds_draw():
    import random

    import numpy as np

    env = child_env()
    env.pop(seed_shift.ENV, None)
    env = dict(env, PYTHONPATH=os.pathsep.join([seed_shift.HERE, env["PYTHONPATH"]]))
    def pcg(seed):                     # what default_rng(seed) draws, never shifted (this suite may be)
        return str(int(np.random.Generator(np.random.PCG64(seed)).integers(1 << 30)))

    shifted = _draws(dict(env, **{seed_shift.ENV: "2"}))
    assert shifted == ["False", "2", "3", "True", pcg(7), "True", str(float(np.random.mtrand.RandomState(3).rand())),
                       "True", str(random.Random(6).random())]
    plain = _draws(env)                                             # the folder on the path, no shift asked
    assert plain[1:3] == ["0", "1"] and plain[4] == pcg(5)


def test_probe_sees_the_suites_shift_here_and_in_its_children():
    """Run by the test below under ``--seed-shift 5``; in a plain run, with no shift."""
    k = seed_shift.shift_from_env()
    torch.manual_seed(0)
    assert torch.initial_seed() == k
    child = subprocess.run([sys.executable, "-c", "import torch; torch.manual_seed(0); print(torch.initial_seed())"],
                           env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert int(child.stdout) == k


def test_pytest_seed_shift_reaches_the_tests_and_their_children():
    env = child_env()
    env.pop(seed_shift.ENV, None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "--seed-shift", "5", "tests/test_seed_shift.py::test_probe_sees_the_suites_shift_here_and_in_its_children"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
