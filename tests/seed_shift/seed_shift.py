"""Every random seed shifted by k: ``pytest --seed-shift K`` (or ``NEO_TEST_SEED_SHIFT=K``).

A test whose assertions hold only for the random values its own seeds happen to draw is a test
that cannot fail for the right reason. Run the suite with its seeds shifted and such tests show
up: each integer seed given to ``torch.manual_seed``, ``torch.Generator().manual_seed``,
``numpy.random.default_rng``, ``numpy.random.seed``, ``numpy.random.RandomState`` and
``random.seed`` becomes seed + k, in the test process and in every process it starts (ranks,
torchrun's workers, subprocesses: they inherit ``NEO_TEST_SEED_SHIFT`` and a ``PYTHONPATH``
holding this folder, whose ``sitecustomize`` installs the same shift at their start).

Modules are patched when they are first imported (an import hook), not imported here: a process
that never imports torch (``neo plan``) does not start importing it.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Callable, Dict

ENV = "NEO_TEST_SEED_SHIFT"
HERE = os.path.dirname(os.path.abspath(__file__))


def _shifted(seed, k: int):
    """``seed`` + k for an integer seed (a bool, None, a sequence or a SeedSequence: as given)."""
    if isinstance(seed, bool) or not hasattr(seed, "__index__"):
        return seed
    return int(seed) + k


def _wrap(fn, k: int):
    if getattr(fn, "_neo_seed_shift", None) is not None:        # installed once
        return fn

    def shifted(seed=None, *a, **kw):
        return fn(_shifted(seed, k), *a, **kw)

    shifted._neo_seed_shift = k
    shifted.__wrapped__ = fn
    return shifted


def _patch_torch(torch, k: int) -> None:
    torch.manual_seed = _wrap(torch.manual_seed, k)
    torch.random.manual_seed = torch.manual_seed
    base = torch.Generator
    if getattr(base, "_neo_seed_shift", None) is None:      # a C type: its methods cannot be replaced
        class Generator(base):
            _neo_seed_shift = k

            def manual_seed(self, seed):
                return super().manual_seed(_shifted(seed, k))

        Generator.__name__ = Generator.__qualname__ = "Generator"
        torch.Generator = Generator


def _patch_numpy_random(npr, k: int) -> None:
    npr.default_rng = _wrap(npr.default_rng, k)
    npr.seed = _wrap(npr.seed, k)
    base = npr.RandomState
    if getattr(base, "_neo_seed_shift", None) is None:
        class RandomState(base):                       # a subclass: isinstance checks still hold
            _neo_seed_shift = k

            def __init__(self, seed=None):
                super().__init__(_shifted(seed, k))

            def seed(self, seed=None):
                super().seed(_shifted(seed, k))

        RandomState.__name__ = RandomState.__qualname__ = "RandomState"
        RandomState.__module__ = base.__module__
        npr.RandomState = RandomState


def _patch_random(random, k: int) -> None:
    random.seed = _wrap(random.seed, k)


_PATCHES: Dict[str, Callable] = {"torch": _patch_torch, "numpy.random": _patch_numpy_random, "random": _patch_random}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules to patch through the other finders and patches each after it runs."""

    def __init__(self, k: int) -> None:
        self.k = k

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run, k, patch = spec.loader.exec_module, self.k, _PATCHES[name]

                def exec_module(module, run=run):
                    run(module)
                    patch(module, k)

                spec.loader.exec_module = exec_module
                return spec
        return None


def install(k: int) -> None:
    """Shift every seed by ``k`` in this process: the modules already imported now, the others
    when they are."""
    # once a process (by class name: the suite imports this file as tests.seed_shift.seed_shift,
    # a child's sitecustomize as seed_shift)
    if not k or any(type(f).__name__ == "_PatchOnImport" for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PatchOnImport(k))
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name], k)


def shift_from_env() -> int:
    value = os.environ.get(ENV, "").strip()
    try:
        return int(value or 0)
    except ValueError:
        raise SystemExit(f"{ENV}={value!r}: an integer (the shift added to every seed) or unset") from None


def export(k: int) -> None:
    """Make the processes this one starts shift their seeds by ``k`` too."""
    os.environ[ENV] = str(k)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if HERE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([HERE] + paths)
