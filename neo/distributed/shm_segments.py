"""The shared-memory segments under :mod:`neo.distributed.shm`'s exchange: its errors, the
``/dev/shm`` files mapped as slot segments (:class:`_Segment`), copies between mapped memory
and tensors, the peers' process checks, and the unlinking of the segment files."""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from typing import List, Optional

import torch

_SHM_DIR = "/dev/shm"


class ShmError(RuntimeError):
    """A shared-memory collective was misused (e.g. the ranks disagree on a message's size)."""


class ShmTimeout(ShmError):
    """A rank waited longer than the group's timeout for a peer (which has probably failed)."""


class ShmPeerGone(ShmTimeout):
    """A peer's process exited while this rank waited for it: no need to wait out the timeout."""


def _pid_namespace() -> Optional[str]:
    """This process's pid namespace (``pid:[...]``), None where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_exists(pid: int) -> bool:
    """Whether ``pid`` (of this pid namespace) is a process that has not exited: a zombie (exited,
    not yet reaped by its parent) counts as exited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True                               # unreadable: assume it is there
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"   # the state follows "(comm) "


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


_MEMMOVE_MAX = 1 << 20
"""Chunks below this many bytes are copied by ``memmove`` on their addresses (no tensor views:
a few microseconds less per chunk, most of a small collective's cost); larger ones by torch's
copy where it has more than one intra-op thread to split them across, else by ``memmove`` too
(torch's copy on one thread is a byte loop of its own, slower than glibc's: with it,
``tools/bench_collectives.py`` at W 2, one thread a rank, 8 MB a peer, took 4.84-5.19 ms an
AlltoAll and 3.51-3.74 ms back to back, against 4.31-4.47 and 2.82-2.91 with ``memmove``; Intel
Xeon `GenuineIntel 6/207/2`, 2026-12-06, docs/benchmarks.md)"""


def _move(dst: int, src: int, n: int) -> None:
    """Copy ``n`` bytes from address ``src`` to address ``dst`` (live memory of the caller's tensors
    or of mapped segments)."""
    if n < _MEMMOVE_MAX or torch.get_num_threads() == 1:
        ctypes.memmove(dst, src, n)
    else:
        _at(dst, n).copy_(_at(src, n))


def _at(addr: int, n: int) -> torch.Tensor:
    """A uint8 tensor over ``n`` bytes at ``addr`` (not owning them)."""
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(addr), dtype=torch.uint8)


@dataclass
class _Segment:
    """One mapped slot segment: bytes as a tensor, its header as int64 words.

    The sender keeps the file descriptor of its own segments and reserves pages with
    ``posix_fallocate`` before it first writes past the reserved size: a full /dev/shm then
    fails there with a clear error, instead of a SIGBUS in the middle of a copy."""

    gen: int
    mm: mmap.mmap
    data: torch.Tensor
    header: memoryview
    fd: Optional[int] = None
    reserved: int = 0

    @property
    def addr(self) -> int:
        """Address of the segment's first byte (the mapping stays for the segment's life)."""
        return self.data.data_ptr()

    @classmethod
    def open(cls, path: str, gen: int, size: Optional[int] = None) -> "_Segment":
        """Map ``path``; with ``size``, create it (sparse) and keep its descriptor."""
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if size is not None else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if size is not None:
                os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size if size is not None else os.fstat(fd).st_size)
        except BaseException:
            os.close(fd)
            raise
        if size is None:
            os.close(fd)
            fd = None
        return cls(gen, mm, torch.frombuffer(mm, dtype=torch.uint8), memoryview(mm).cast("B").cast("q"), fd)

    def reserve(self, n: int) -> None:
        if n <= self.reserved:
            return
        n = min(len(self.mm), max(n, 2 * self.reserved, 1 << 20))
        try:
            os.posix_fallocate(self.fd, 0, n)
        except OSError as e:
            free = os.statvfs(_SHM_DIR)
            raise ShmError(f"{_SHM_DIR} cannot hold {n / 2**20:.1f} MiB more for a shared-memory collective "
                           f"({free.f_bavail * free.f_frsize / 2**20:.0f} MiB free): enlarge it (e.g. docker "
                           f"--shm-size) or build the process groups with shm=False ({e})") from None
        self.reserved = n

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _release(files: List[tuple], own: List[_Segment]) -> None:
    _unlink_all(files)
    for seg in own:
        seg.release()


def _unlink_all(files: List[tuple]) -> None:
    for _, path in files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    files.clear()
