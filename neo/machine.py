"""What machine this is: CPU model and vector ISA, cores, memory, GPU, and the device kind the
planner's constants are for (cpu, h100, h200). Reads /proc and sysfs only: no torch import, so
``neo plan`` stays fast; a GPU is recognised from the NVIDIA driver's /proc entries."""

from __future__ import annotations

import glob
import os
import platform
from typing import Any, Dict, Optional

__all__ = ["machine_info", "device_kind_of"]


def _cpu() -> Dict[str, Any]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = "avx512" if {"avx512f", "avx512bw", "avx512vl"} <= flags else "avx2" if "avx2" in flags else "baseline"
    return {"cpu_model": model or platform.processor() or platform.machine(), "cpu_isa": isa}


def _gpu() -> Optional[str]:
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                for line in f:
                    if line.startswith("Model:"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def device_kind_of(gpu: Optional[str]) -> str:
    """cpu, h100 or h200 (other GPUs: h100, the nearest built-in defaults)."""
    if not gpu:
        return "cpu"
    return "h200" if "H200" in gpu.upper() else "h100"


def machine_info() -> Dict[str, Any]:
    """CPU model and widest vector ISA, cores, RAM bytes, GPU model (or None) and device kind."""
    gpu = _gpu()
    out = _cpu()
    out.update(cores=os.cpu_count() or 1, gpu=gpu, device_kind=device_kind_of(gpu))
    try:
        out["ram_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        out["ram_bytes"] = 0
    return out


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask on Linux, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                    # not Linux
        return os.cpu_count() or 1
