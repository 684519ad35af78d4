"""The trainer's evaluation: exact AUC, log loss and accuracy over every rank's validation
samples, in batches of ``train.eval_batch_size`` (``train.batch_size`` when 0).

Every rank runs the same number of batches (the most any rank has; a rank out of samples runs
empty, padded ones), because each batch's input distribution is a collective. A short batch is
padded to the evaluation batch size with empty bags and zero dense features; only its real
samples reach the metrics.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from neo.embedding.cache import CacheCapacityError
from neo.sparse import KeyedJaggedBatch
from neo.train.data import rename_features
from neo.train.metrics import BinaryMetrics

__all__ = ["Evaluator", "pad_batch"]


def pad_batch(batch, keys: Sequence[str], B: int, num_dense: int
              ) -> Tuple[torch.Tensor, KeyedJaggedBatch, torch.Tensor, int]:
    """(dense (B, num_dense), sparse of B samples, labels (B,), real count): ``batch`` (None: no
    sample) padded to ``B`` samples with empty bags."""
    if batch is None:
        sparse = KeyedJaggedBatch(tuple(keys), torch.zeros(0, dtype=torch.int64),
                                  torch.zeros(len(keys) * B, dtype=torch.int64), B, validate=False)
        return torch.zeros(B, num_dense), sparse, torch.zeros(B), 0
    n = batch.batch_size
    if n == B:
        return batch.dense, batch.sparse, batch.labels, n
    s = batch.sparse
    lengths = torch.zeros(len(s.keys), B, dtype=s.lengths.dtype)
    lengths[:, :n] = s.lengths.view(len(s.keys), n)
    sparse = KeyedJaggedBatch(s.keys, s.values, lengths.reshape(-1), B, weights=s.weights, validate=False)
    dense = torch.zeros(B, batch.dense.shape[1])
    dense[:n] = batch.dense
    labels = torch.zeros(B)
    labels[:n] = batch.labels
    return dense, sparse, labels, n


class Evaluator:
    """Evaluates the trainer's model (``__call__``: collective over ``pg.world``).

    Args:
        loader: this rank's validation loader (None: no validation set, no metrics).
        train: the ``train`` config section (eval_batch_size, eval_batches, batch_size).
        mapping: data keys -> table features (None: the same names).
        sharded, step_module, model: the sharded embeddings, the step's dense module, the model.
        pipeline: the pipelined dense towers (their weights gathered first), or None.
        pg: the process groups; num_dense: dense features; device: where the model runs.
    """

    def __init__(self, loader, train, mapping: Optional[Dict[str, str]], sharded, step_module, model, pipeline,
                 pg, num_dense: int, device):
        self.loader, self.train, self.mapping = loader, train, mapping
        self.sharded, self.step_module, self.model, self.pipeline = sharded, step_module, model, pipeline
        self.pg, self.num_dense, self.device = pg, num_dense, device

    @torch.no_grad()
    def __call__(self) -> Dict[str, Any]:
        loader, B = self.loader, self.train.eval_batch
        if loader is None:
            return {}
        loader.set_epoch(0)
        n_local = math.ceil(loader.shard_size / B)
        if self.train.eval_batches:
            n_local = min(n_local, self.train.eval_batches)
        n = torch.tensor([n_local])
        multi = self.pg.world_size > 1
        if multi:
            dist.all_reduce(n, op=dist.ReduceOp.MAX, group=self.pg.world)
        names = loader.meta.sparse_names
        keys = tuple(self.mapping.get(k, k) for k in names) if self.mapping else tuple(names)
        metrics = BinaryMetrics()
        if self.pipeline is not None:
            self.pipeline.sync_weights()                               # the whole trained dense model here
        self.model.eval()
        it = iter(loader)
        try:
            for i in range(int(n)):
                batch = next(it, None) if i < n_local else None
                if batch is not None:
                    batch = rename_features(batch, self.mapping)
                dense, sparse, labels, count = pad_batch(batch, keys, B, self.num_dense)
                dist_batch = self.sharded.input_dist(sparse.to(self.device)).wait()
                logits = self.step_module(dense.to(self.device), dist_batch)
                metrics.update(logits[:count], labels[:count])
        except CacheCapacityError as e:
            raise CacheCapacityError(f"{e}. This was an evaluation batch of train.eval_batch_size = {B} samples "
                                     f"(train.batch_size {self.train.batch_size}): a smaller eval_batch_size needs "
                                     "fewer rows at once") from e
        finally:
            it.close()
            self.model.train()
        return metrics.compute(self.pg.world if multi else None)
