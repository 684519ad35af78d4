"""Neo: training deep-learning recommendation models with embedding tables larger than one device."""

from neo.sparse import KeyedJaggedBatch  # noqa: F401

__version__ = "0.1.0"
