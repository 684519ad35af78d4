"""Neo: training deep-learning recommendation models with embedding tables larger than one device."""

__version__ = "0.1.0"

from neo.host_memory import request_huge_pages as _request_huge_pages

_request_huge_pages()   # before the process's first large torch allocation: see neo.host_memory


def __getattr__(name: str):
    """``neo.KeyedJaggedBatch`` on first use (``neo plan`` and ``neo cache-report`` run without torch)."""
    if name == "KeyedJaggedBatch":
        from neo.sparse import KeyedJaggedBatch

        return KeyedJaggedBatch
    raise AttributeError(f"module 'neo' has no attribute {name!r}")
