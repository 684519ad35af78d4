"""Suite-wide test settings: the run's own temporary folder, the ``multiprocess`` marker and
``--seed-shift``.

Every test in a module that uses the shared multi-process helper (``tests.multiprocess``) or
launches ``torchrun`` is marked ``multiprocess``: they take most of the suite's time, so a quick
loop while editing can leave them out (``pytest -m "not multiprocess"``) and CI runs everything in
one pass.

``pytest --seed-shift K`` (or ``NEO_TEST_SEED_SHIFT=K``) adds K to every integer seed, in the
suite's process and in every process it starts (``tests/seed_shift``): a test that holds only for
the random values its own seeds draw fails under another K.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.multiprocess import run_multiprocess
from tests.seed_shift import seed_shift


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--seed-shift", type=int, default=None, metavar="K",
                     help="add K to every integer seed, here and in the processes the tests start "
                          f"(default: ${seed_shift.ENV}, else 0)")


def pytest_configure(config: pytest.Config) -> None:
    # One temporary folder of the run's own, removed when it ends. The planner reads this
    # machine's calibration from the user's cache directory; the suite (and the ranks and torchrun
    # it starts, which inherit the environment) must see a fresh machine's defaults, not whatever
    # ``neo calibrate`` left on the developer's machine: XDG_CACHE_HOME is the folder. So is
    # TMPDIR: what the suite and its children write to the temporary directory (torchrun's
    # torchelastic_* folders, ``neo calibrate``'s data, torch's own) goes there too. Kept short:
    # AF_UNIX socket paths under it (multiprocessing's) must stay below 108 bytes.
    import multiprocessing.util

    tmp = tempfile.gettempdir()
    # Left where they were: pytest's tmp_path root (pytest keeps the last 3 runs' there), and this
    # process's multiprocessing folder (the fork server's socket), which multiprocessing removes
    # at exit, after pytest_unconfigure.
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tmp)
    multiprocessing.util.get_temp_dir()
    config._neo_tmp_dir = tempfile.mkdtemp(prefix="neo-test-", dir=tmp)
    os.environ["XDG_CACHE_HOME"] = config._neo_tmp_dir
    os.environ["TMPDIR"] = config._neo_tmp_dir
    tempfile.tempdir = None                # re-read from TMPDIR at the next gettempdir()
    config.addinivalue_line("markers", "multiprocess: spawns gloo ranks or torchrun (most of the suite's time)")
    _interpret_triton_without_cuda()
    _share_cores_between_workers()
    k = config.getoption("--seed-shift")
    k = seed_shift.shift_from_env() if k is None else k
    if k:                                  # before any test: the ranks' fork server starts with it
        seed_shift.export(k)
        seed_shift.install(k)


def _interpret_triton_without_cuda() -> None:
    """Without CUDA the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``), which
    must be chosen before triton is first imported in the process: ``triton.language``'s own
    ``@jit`` helpers are decorated then, and an interpreted kernel cannot call a compiled helper
    ("Cannot call @triton.jit'd outside of the scope of a kernel"). Any module collected first
    may import triton (TorchRec's import does: ``tests/tools/test_bench_interaction.py``), so it
    is set here, before collection, not in the Triton tests' module: ``pytest tests/tools
    tests/embedding`` failed those 46 tests. Tests of the refusal without it remove it
    themselves."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _share_cores_between_workers() -> None:
    """Under pytest-xdist (``-n W``) each worker takes cores / W intra-op threads, and so do the
    processes it starts (``OMP_NUM_THREADS``, read when they import torch): W workers at the
    machine's full thread count each would oversubscribe the cores, where OpenMP's waiting
    threads spin (``tests/models/test_dlrm.py`` took 6x its serial time so). A serial run keeps
    torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    import torch

    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def pytest_report_header(config: pytest.Config):
    k = seed_shift.shift_from_env()
    return [f"seeds shifted by {k} ({seed_shift.ENV})"] if k else []


def pytest_unconfigure(config: pytest.Config) -> None:
    # The folder is the run's own: removed when the run ends, not left in /tmp.
    tmp_dir = getattr(config, "_neo_tmp_dir", None)
    if tmp_dir is not None:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "run_multiprocess", None) is run_multiprocess:
            item.add_marker(pytest.mark.multiprocess)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test starts with the suite's thread count: an in-process ``neo.cli.main`` (the
    trainer's ``train.threads``) sets torch's, which would change the MKL GEMMs' sums, and so
    the last bits, of every later test's dense layers."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)

