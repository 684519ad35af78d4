"""neo.host_memory: a step's freed tensors are reused without new page faults; torch's large
buffers are advised huge pages once neo is imported."""

import os
import resource
import subprocess
import sys

import pytest
import torch

from neo.host_memory import THP_ENV, request_huge_pages, retain_freed_memory, transparent_hugepage_mode


def _step_faults() -> int:
    """Minor page faults of one step-like pattern: six 6.5 MiB tensors live at once, then freed.

    Under glibc's defaults the freed heap top exceeds its (dynamic) trim threshold and is
    returned to the kernel, so every other step faults about 3,300 pages in again."""
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.empty(2048, 832) for _ in range(6)]
    for x in xs:
        x.fill_(1.0)
    del xs
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")
def test_retained_memory_is_reused_without_page_faults():
    assert retain_freed_memory() is True
    assert retain_freed_memory() is True                # idempotent
    for _ in range(20):                                 # the heap reaches its peak
        _step_faults()
    faults = sum(_step_faults() for _ in range(10))
    pages = 10 * 6 * 2048 * 832 * 4 // 4096
    assert faults < pages // 50, f"{faults} page faults in 10 steps that allocate {pages} pages"


_PROBE = r"""
import os, sys
if sys.argv[1] == "neo":
    import neo  # noqa: F401
import torch
t = torch.empty(16 << 20, dtype=torch.uint8)      # 16 MiB: above torch's 2 MiB threshold
t.fill_(1)
addr, inside, flags = t.data_ptr(), False, None
with open("/proc/self/smaps") as f:               # the mapping that holds the tensor: its VmFlags
    for line in f:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            flags = line.split()[1:]
print(os.environ.get("THP_MEM_ALLOC_ENABLE"), "hg" in flags)
"""


def _probe(import_neo: bool, env_value=None):
    """(THP_MEM_ALLOC_ENABLE after the imports, whether a 16 MiB tensor's mapping is MADV_HUGEPAGE)
    in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k != THP_ENV}
    if env_value is not None:
        env[THP_ENV] = env_value
    out = subprocess.run([sys.executable, "-c", _PROBE, "neo" if import_neo else "torch"], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0], out[1] == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_HUGEPAGE and /proc/self/smaps are Linux's")
def test_importing_neo_makes_torch_advise_huge_pages_for_its_large_buffers():
    thp = transparent_hugepage_mode() != "unavailable"     # the kernel has THP: neo asks, torch advises
    assert _probe(import_neo=False) == ("None", False)      # torch alone: 4 KiB pages
    assert _probe(import_neo=True) == (("1", True) if thp else ("None", False))   # neo first: MADV_HUGEPAGE
    assert _probe(import_neo=True, env_value="0") == ("0", False)   # the user's choice stands


def test_request_huge_pages_keeps_a_value_already_set(monkeypatch):
    monkeypatch.setenv(THP_ENV, "0")
    assert request_huge_pages() is False and os.environ[THP_ENV] == "0"
    monkeypatch.delenv(THP_ENV)
    available = sys.platform.startswith("linux") and transparent_hugepage_mode() != "unavailable"
    assert request_huge_pages() is available and os.environ.get(THP_ENV) == ("1" if available else None)


def test_no_request_where_the_kernel_has_no_transparent_huge_pages(monkeypatch):
    # torch's madvise would fail there and warn in every process
    import neo.host_memory as hm

    monkeypatch.delenv(THP_ENV, raising=False)
    monkeypatch.setattr(hm, "transparent_hugepage_mode", lambda: "unavailable")
    assert hm.request_huge_pages() is False and THP_ENV not in os.environ
    monkeypatch.setenv(THP_ENV, "1")                        # a user's explicit request still stands
    assert hm.request_huge_pages() is True and os.environ[THP_ENV] == "1"
