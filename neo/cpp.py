"""The C++ extension ``neo._C`` (built from ``csrc/`` by setup.py), where it is built.

Its hot kernels are built once per ISA (``baseline``, ``avx2``, ``avx512`` on x86-64) and
the best one the CPU runs is chosen at import; ``NEO_CPU_ISA=baseline|avx2|avx512`` asks
for another (an unknown one, or one this CPU lacks, fails the import with a message that
says what the CPU offers). :func:`cpu_isa_info` says what was chosen, for run logs and
benchmark records; :func:`use_cpu_isa` switches variants for tests and benchmarks.
``NEO_INTERACTION_TILES=auto|narrow|wide|grouped|tall`` chooses the dot interaction
forward's tiling in the AVX-512 and AVX2 kernels (``csrc/cpu_isa.h``); :func:`use_interaction_tiles`
switches it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional

__all__ = ["KernelSettingError", "check_kernel_settings", "cpu_kernels", "cpu_isa_info", "cpu_model", "cpu_id",
           "cpu_caches", "cache_size_bytes", "use_cpu_isa", "use_interaction_tiles"]

# The environment variables neo._C reads when it loads; a bad value makes the load fail.
_SETTINGS = ("NEO_CPU_ISA", "NEO_INTERACTION_TILES")


class KernelSettingError(ImportError):
    """neo._C refused to load because ``NEO_CPU_ISA`` or ``NEO_INTERACTION_TILES`` asks for what it
    cannot do (the message names the variable, its value and what is valid on this CPU)."""


def check_kernel_settings() -> None:
    """Load neo._C now, so that a bad ``NEO_CPU_ISA`` or ``NEO_INTERACTION_TILES`` is said before a
    command starts its work: :class:`KernelSettingError`. Nothing where neo._C is not built."""
    cpu_kernels("cpu_isa")

# /proc/cpuinfo flags worth recording next to a benchmark figure.
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
              "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "asimd", "sve")


@functools.lru_cache(maxsize=None)
def cpu_kernels(op: str) -> Optional[ModuleType]:
    """``neo._C`` if it is built and has ``op`` (a build of older sources may lack newer ops), else None.

    A ``NEO_CPU_ISA`` this CPU cannot honour, or a ``NEO_INTERACTION_TILES`` that is not a tiling,
    is an error, not a silent fall-back to plain torch (neo._C refuses to load on either).
    Answered once per op (a failed import costs ~0.15 ms, too much for callers in a batch loop)."""
    import torch  # noqa: F401  (loads libc10 and the other libraries neo._C links against)

    try:
        from neo import _C
    except ImportError as e:
        if any(f"{var}=" in str(e) for var in _SETTINGS):
            raise KernelSettingError(str(e)) from e
        return None
    return _C if hasattr(_C, op) else None


def _cpuinfo() -> Dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (Linux), else {}."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read().split("\n\n")[0]
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere ``platform.processor()``)."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_id() -> Optional[str]:
    """Vendor, family, model and stepping (``/proc/cpuinfo``: "GenuineIntel 6/207/2"), or None
    where the file lacks them. Shared VMs often report one model name for several generations
    ("Intel(R) Xeon(R) Processor"); these numbers tell the machines of two records apart."""
    info = _cpuinfo()
    fields = [info.get(k) for k in ("vendor_id", "cpu family", "model", "stepping")]
    if not all(fields):
        return None
    return f"{fields[0]} {fields[1]}/{fields[2]}/{fields[3]}"


def cpu_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> Dict[str, str]:
    """The first CPU's caches as sysfs gives them: ``{"L1d": "48K", "L1i": "64K", "L2": "2048K",
    "L3": "516096K"}`` (a level's size per instance: shared levels are one cache for several
    cores); {} where sysfs has no cache directory (not Linux)."""
    out: Dict[str, str] = {}
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return out
    for e in entries:
        try:
            level, kind, size = (_read(os.path.join(root, e, f)) for f in ("level", "type", "size"))
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[f"L{level}{suffix}"] = size
    return out


def cache_size_bytes(size: Optional[str]) -> Optional[int]:
    """Bytes of a cache size as sysfs (:func:`cpu_caches`) gives it: ``"48K"``, ``"32M"``, or a
    plain number of bytes; None where there is none or it does not parse."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = (size or "").strip()
    try:
        return int(s[:-1]) * units[s[-1]] if s[-1:] in units else int(s)
    except ValueError:
        return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def cpu_flags() -> List[str]:
    """The ISA extensions of this CPU among those that matter to the kernels and their peers."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return [f for f in _ISA_FLAGS if f in flags]


def cpu_isa_info() -> Dict[str, Any]:
    """What the CPU kernels run on: ``{"neo_cpu_isa", "interaction_tiles", "built", "supported",
    "forced", "cpu_model", "cpu_id", "cpu_caches", "cpu_flags", "machine"}`` (``neo_cpu_isa`` is None where ``neo._C`` is
    not built; ``interaction_tiles``: the setting, and at D 128 whether the forward runs wide,
    the tiles it runs at D 64 and 128, and whether the next sample's rows are prefetched into L1
    rather than L2)."""
    _C = cpu_kernels("cpu_isa")
    tiles = cpu_kernels("interaction_tiles")
    l1_next = cpu_kernels("interaction_l1_next")
    return {
        "neo_cpu_isa": _C.cpu_isa() if _C else None,
        "interaction_tiles": ({"setting": tiles.interaction_tiles(), "wide_at_d128": tiles.interaction_wide(128),
                               "forward_at_d64": tiles.interaction_forward_tiles(64),
                               "forward_at_d128": tiles.interaction_forward_tiles(128),
                               "l1_next": l1_next.interaction_l1_next() if l1_next else None}
                              if tiles else None),
        "built": _C.cpu_isa_variants() if _C else [],
        "supported": _C.cpu_isa_supported() if _C else [],
        "forced": os.environ.get("NEO_CPU_ISA") or None,
        "cpu_model": cpu_model(),
        "cpu_id": cpu_id(),
        "cpu_caches": cpu_caches(),
        "cpu_flags": cpu_flags(),
        "machine": platform.machine(),
    }


def describe_cpu_kernels(info: Dict[str, Any]) -> str:
    """The kernels' ISA in one line for logs, from :func:`cpu_isa_info`: ``avx2 (built: baseline,
    avx2, avx512; runnable here: ...; CPU: <model>; NEO_CPU_ISA=avx2)``."""
    forced = f"; NEO_CPU_ISA={info['forced']}" if info["forced"] else ""
    return (f"{info['neo_cpu_isa']} (built: {', '.join(info['built'])}; runnable here: "
            f"{', '.join(info['supported'])}; CPU: {info['cpu_model']}{forced})")


@contextlib.contextmanager
def use_cpu_isa(name: str) -> Iterator[None]:
    """Run the block with the kernels of ISA variant ``name`` (``"auto"``: the best), then
    restore the previous one. RuntimeError if this CPU cannot run it. Process-wide: meant for
    tests and benchmarks, not for code running kernels on other threads meanwhile."""
    from neo import _C

    with _switched(_C.cpu_isa, _C._set_cpu_isa, name):
        yield


@contextlib.contextmanager
def use_interaction_tiles(name: str) -> Iterator[None]:
    """Run the block with the dot interaction forward's tiles set to ``name`` (``"auto"``,
    ``"narrow"``, ``"wide"``, ``"grouped"``, ``"tall"``; wide applies to the AVX-512 kernels at
    D >= 96 only, grouped to the AVX-512 kernels at D >= 16, tall to the AVX2 kernels), then
    restore the previous setting. Process-wide, for tests and benchmarks, like :func:`use_cpu_isa`."""
    from neo import _C

    with _switched(_C.interaction_tiles, _C._set_interaction_tiles, name):
        yield


@contextlib.contextmanager
def _switched(get: Callable[[], str], set_: Callable[[str], None], name: str) -> Iterator[None]:
    """``set_(name)`` for the block, then the value ``get()`` had before."""
    before = get()
    set_(name)
    try:
        yield
    finally:
        set_(before)
