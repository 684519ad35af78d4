"""Neo: training deep-learning recommendation models with embedding tables larger than one device."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``neo.KeyedJaggedBatch`` on first use (``neo plan`` and ``neo cache-report`` run without torch)."""
    if name == "KeyedJaggedBatch":
        from neo.sparse import KeyedJaggedBatch

        return KeyedJaggedBatch
    raise AttributeError(f"module 'neo' has no attribute {name!r}")
