"""Software-managed embedding cache: hot rows in fast memory, every row in a backing store.

A table with ``placement: cached`` occupies only ``cache_capacity`` rows (slots) of its
group's fast buffers; the fused kernels run on those slots unchanged. Before a batch's lookup
its rows are made resident (prefetched, under the previous step in the training pipeline) and
its ids translated to slots. See docs/cache.md.

- :mod:`.index`: slot map and eviction policies (lru, lfu, lookahead), no data;
- :mod:`.store`: backing stores (host memory, memory-mapped file);
- :mod:`.table_cache`: one table's moves between store and slots, write-back, statistics;
- :mod:`.moves`: the data path, torch indexing or Triton kernels (the GPU cache);
- :mod:`.prefetch`: every cached table of a module, prefetched on a worker thread;
- :mod:`.simulate`: the same policies (and Belady's optimum) on id traces (``neo cache-report``).
"""

from neo.embedding.cache.index import Admission, CacheCapacityError, CacheIndex
from neo.embedding.cache.prefetch import ModuleCache, Prefetched
from neo.embedding.cache.store import BackingStore, CacheStoreError, HostStore, MmapStore
from neo.embedding.cache.table_cache import CacheStats, TableCache

__all__ = ["Admission", "CacheCapacityError", "CacheIndex", "ModuleCache", "Prefetched", "BackingStore",
           "CacheStoreError", "HostStore", "MmapStore", "CacheStats", "TableCache", "make_store"]


def make_store(cfg, device, store_dir):
    """The backing store of cached table ``cfg`` for a cache on ``device`` (see ``cache_store``)."""
    import torch

    from neo.config.embedding import CacheStore

    kind = cfg.cache_store
    if kind is CacheStore.AUTO:
        kind = CacheStore.HOST if torch.device(device).type == "cuda" else CacheStore.MMAP
    rowwise = [cfg.optimizer.type.rowwise_state] * len(cfg.optimizer.type.state_names())
    if kind is CacheStore.HOST:
        return HostStore(cfg.name, cfg.num_rows, cfg.dim, cfg.dtype.torch_dtype, rowwise,
                         pin=torch.device(device).type == "cuda")
    directory = cfg.cache_dir or store_dir
    if directory is None:
        raise CacheStoreError(f"table '{cfg.name}': cache_store mmap needs a directory: set the table's cache_dir "
                              "or the module's store_dir (neo train: train.cache_store_dir)")
    return MmapStore(cfg.name, cfg.num_rows, cfg.dim, cfg.dtype.torch_dtype, rowwise, directory,
                     trim_bytes=int(cfg.cache_store_resident_gib * 2**30))
