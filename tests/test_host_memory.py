"""neo.host_memory: a step's freed tensors are reused without new page faults."""

import resource
import sys

import pytest
import torch

from neo.host_memory import retain_freed_memory


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
