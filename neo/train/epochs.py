"""A run's training batches, epoch by epoch, as both trainers read them.

Every rank takes the same number of steps: an epoch is ``steps_per_epoch`` batches of ``B``
samples on every rank (``(N // W) // B``, neo/train/trainer.py), even where a rank's shard, one
sample longer, would give its loader one batch more. A run of ``total_steps`` steps that starts
at step ``start`` reads exactly ``total_steps - start`` batches, moving its loader on to the
next epoch by hand whenever ``steps_per_epoch`` batches of the current one are read.

:func:`epoch_batches` is that loop (:class:`neo.train.trainer.Trainer` and
:class:`neo.async_train.wsp.WSPTrainer` read through it); :func:`seek` puts a loader where step
``start`` left it, for a run resumed without the loader's saved state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, Optional

from neo.train.data import rename_features

if TYPE_CHECKING:
    from data_pipeline.loader import Batch, ParquetLoader

__all__ = ["epoch_batches", "seek"]


def seek(loader: ParquetLoader, step: int, steps_per_epoch: int, B: int) -> None:
    """Put ``loader`` where ``step`` batches of ``steps_per_epoch`` per epoch leave it: epoch
    ``step // steps_per_epoch``, ``(step % steps_per_epoch) * B`` samples into it."""
    state = loader.state_dict()
    state.update(epoch=step // steps_per_epoch, position=(step % steps_per_epoch) * B)
    loader.load_state_dict(state)


def epoch_batches(loader: ParquetLoader, start: int, total_steps: int, steps_per_epoch: int, B: int,
                  mapping: Optional[Dict[str, str]]) -> Iterator[Batch]:
    """Yield the batches of steps ``start`` to ``total_steps - 1`` from ``loader`` where it
    stands, ``steps_per_epoch`` per epoch, their sparse keys renamed by ``mapping``
    (:func:`neo.train.data.rename_features`).

    At each yield ``loader.state_dict()`` is the position after the batch just yielded (what a
    checkpoint of that step saves): the next batch is not read until the next one is asked for.
    A loader at or past the end of its epoch (a run resumed there) starts the next epoch first.
    Each epoch's iterator is closed on every way out: the last step, the epoch's end, an error,
    or this generator closed early."""
    produced = start
    while produced < total_steps:
        if loader.position // B >= steps_per_epoch:
            loader.set_epoch(loader.epoch + 1)
        it = iter(loader)
        try:
            for batch in it:
                produced += 1
                yield rename_features(batch, mapping)
                if produced >= total_steps or loader.position // B >= steps_per_epoch:
                    break
        finally:
            it.close()
