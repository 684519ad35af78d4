"""TableBatchedEmbedding: many embedding tables, one kernel launch per group, optimizer fused into backward.

Example::

    tables = [TableConfig("user", num_rows=1000, dim=16, optimizer=OptimizerConfig("adagrad", lr=0.1)),
              TableConfig("item", num_rows=500, dim=8, feature_names=("item", "item_hist"))]
    emb = TableBatchedEmbedding(tables, backend="cpu")
    pooled = emb(batch)          # (B, 16 + 8 + 8): features user, item, item_hist in table order
    loss(pooled).backward()      # updates the touched rows in place; no .grad, no optimizer.step()

Tables with the same weight dtype and optimizer share a group: one flat buffer and one
kernel launch (see :mod:`neo.embedding.layout`). The backward pass never forms a dense
gradient: the backend sums each touched row's gradients and applies the optimizer to it
in the same pass.

Input checks (``validate=True``, the default): the batch's features must be exactly the
module's, ids must be int32/int64, and every id must lie in ``[0, rows)`` of its table;
failures raise :class:`~neo.embedding.checks.EmbeddingInputError` naming feature and
table. ``validate=False`` skips them for speed: backends then ignore invalid ids (they
contribute zero and are not updated) rather than touch memory out of bounds.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from neo.config.embedding import TableConfig
from neo.embedding.backends import get_backend, resolve_backend_name
from neo.embedding.checks import EmbeddingInputError, check_features, check_ids
from neo.embedding.layout import GroupLayout, group_key
from neo.sparse import KeyedJaggedBatch

__all__ = ["TableBatchedEmbedding", "EmbeddingInputError"]


class _GroupRunner:
    """One group's storage and its backend; ``forward``/``backward_update`` in one place."""

    def __init__(self, owner: "TableBatchedEmbedding", index: int, layout: GroupLayout):
        self.owner, self.index, self.layout = owner, index, layout

    @property
    def weights(self) -> torch.Tensor:
        return getattr(self.owner, f"group{self.index}_weights")

    @property
    def states(self) -> List[torch.Tensor]:
        return [getattr(self.owner, f"group{self.index}_{n}") for n in self.layout.optimizer.type.state_names()]

    @property
    def step(self) -> torch.Tensor:
        return getattr(self.owner, f"group{self.index}_step")


class _PooledLookup(torch.autograd.Function):
    """Forward: pooled lookup. Backward: fused gradient aggregation + optimizer step, returns no grads."""

    @staticmethod
    def forward(ctx, anchor, runner: _GroupRunner, indices, offsets, per_sample_weights, batch_size: int):
        owner = runner.owner
        ctx.runner, ctx.batch_size = runner, batch_size
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        prepare = getattr(owner.backend, "prepare", None)   # backends that wrap storage (fbgemm)
        if prepare is not None:
            prepare(runner.layout, runner.weights, runner.states)
        return owner.backend.forward(runner.layout, runner.weights, indices, offsets, per_sample_weights, batch_size)

    @staticmethod
    def backward(ctx, grad_output):
        indices, offsets, per_sample_weights = ctx.saved_tensors
        runner = ctx.runner
        owner = runner.owner
        runner.step.add_(1)
        owner.backend.backward_update(
            runner.layout, runner.weights, runner.states, grad_output.contiguous().to(torch.float32),
            indices, offsets, per_sample_weights, ctx.batch_size,
            owner.learning_rates[runner.index], int(runner.step), owner.seed,
        )
        return None, None, None, None, None, None


class TableBatchedEmbedding(nn.Module):
    """Embedding tables looked up together; see the module docstring.

    Args:
        tables: the tables; their feature names must be distinct across tables.
        backend: ``"auto"`` (cpu kernels on CPU if built, triton on CUDA), ``"reference"``,
            ``"cpu"``, ``"triton"`` or ``"fbgemm"``.
        device: where weights and optimizer state live.
        validate: check inputs and name the feature and table at fault (see module doc).
        seed: seeds the initial weights and stochastic rounding.
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        backend: str = "auto",
        device: Optional[torch.device | str] = None,
        validate: bool = True,
        seed: int = 0,
    ):
        super().__init__()
        tables = list(tables)
        if not tables:
            raise ValueError("TableBatchedEmbedding needs at least one table")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names repeat: {names}")
        self.feature_table: Dict[str, str] = {}
        for t in tables:
            for f in t.feature_names:
                if f in self.feature_table:
                    raise ValueError(f"feature '{f}' is read by tables '{self.feature_table[f]}' and '{t.name}'")
                self.feature_table[f] = t.name
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.tables = tables
        self.feature_names = [f for t in tables for f in t.feature_names]
        self.validate, self.seed = validate, seed
        self.backend_name = resolve_backend_name(backend, device)
        self.backend = get_backend(self.backend_name)

        grouped: Dict[tuple, List[TableConfig]] = {}
        for t in tables:
            grouped.setdefault(group_key(t), []).append(t)
        self.groups: List[_GroupRunner] = []
        self.learning_rates: List[float] = []
        gen = torch.Generator().manual_seed(seed)
        for gi, group_tables in enumerate(grouped.values()):
            layout = GroupLayout.build(group_tables, device)
            weights = torch.empty(layout.num_weights, dtype=torch.float32)
            for t, cfg in enumerate(group_tables):
                scale = cfg.init_scale if cfg.init_scale is not None else cfg.num_rows ** -0.5
                off, n = int(layout.weight_offsets[t]), cfg.num_rows * cfg.dim
                weights[off : off + n].uniform_(-scale, scale, generator=gen)
            self.register_buffer(f"group{gi}_weights", weights.to(device=device, dtype=layout.dtype.torch_dtype))
            opt = layout.optimizer
            state_len = layout.num_rows if opt.type.rowwise_state else layout.num_weights
            for name in opt.type.state_names():
                init = opt.initial_accumulator_value if name == "sum" else 0.0
                self.register_buffer(f"group{gi}_{name}", torch.full((state_len,), init, dtype=torch.float32, device=device))
            self.register_buffer(f"group{gi}_step", torch.zeros((), dtype=torch.int64))
            self.groups.append(_GroupRunner(self, gi, layout))
            self.learning_rates.append(opt.lr)

        self._group_order = [f for g in self.groups for f in g.layout.features]
        # column permutation from group order back to table order (None when already equal)
        if self._group_order == self.feature_names:
            self._out_perm = None
        else:
            dims = {f: next(t.dim for t in tables if f in t.feature_names) for f in self.feature_names}
            starts, acc = {}, 0
            for f in self._group_order:
                starts[f] = acc
                acc += dims[f]
            self._out_perm = torch.cat([torch.arange(starts[f], starts[f] + dims[f]) for f in self.feature_names]).to(device)
        self._feature_rows = [next(t.num_rows for t in tables if f in t.feature_names) for f in self._group_order]
        self._feature_table_names = [self.feature_table[f] for f in self._group_order]

    # ------------------------------------------------------------------ forward
    @property
    def output_dim(self) -> int:
        return sum(self.feature_dims)

    @property
    def feature_dims(self) -> List[int]:
        by_feature = {f: t.dim for t in self.tables for f in t.feature_names}
        return [by_feature[f] for f in self.feature_names]

    def forward(self, batch: KeyedJaggedBatch) -> torch.Tensor:
        """Pooled embeddings ``(B, sum of D)``, features in table order."""
        if self.validate:
            check_features(batch, self.feature_names, self.feature_table)
        batch = batch.permute(self._group_order)
        B = batch.batch_size
        values = batch.values.to(torch.int64)
        offsets = batch.offsets.to(torch.int64)
        psw = None if batch.weights is None else batch.weights.to(torch.float32)
        # Backends that count invalid ids in their forward pass (cpu) make the separate id
        # check unnecessary on good input: it runs only to name the culprit once one is seen.
        counted = self.validate and getattr(self.backend, "counts_invalid_ids", False)
        id_check = lambda: check_ids(values, offsets, B, self._group_order,  # noqa: E731
                                     self._feature_rows, self._feature_table_names)
        if self.validate and not counted:
            id_check()
        anchor = None
        if torch.is_grad_enabled() and self.training:
            anchor = torch.empty(0, requires_grad=True)  # makes autograd call the fused backward
        outputs, f0 = [], 0
        for g in self.groups:
            nf = len(g.layout.features)
            lo, hi = int(offsets[f0 * B]), int(offsets[(f0 + nf) * B])
            g_off = offsets[f0 * B : (f0 + nf) * B + 1] - lo
            g_psw = None if psw is None else psw[lo:hi]
            outputs.append(_PooledLookup.apply(anchor, g, values[lo:hi], g_off, g_psw, B))
            if counted and self.backend.last_invalid_count:
                id_check()          # raises, naming feature, table and id
                raise AssertionError("the kernel counted invalid ids that the id check did not find")
            f0 += nf
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)   # (B, sum D) group order
        if self._out_perm is not None:
            out = out.index_select(1, self._out_perm)                           # (B, sum D) table order
        return out

    # ------------------------------------------------------- weights and state
    def _locate(self, name: str):
        for g in self.groups:
            for t, cfg in enumerate(g.layout.tables):
                if cfg.name == name:
                    return g, t, cfg
        raise KeyError(f"no table named '{name}' (tables: {[t.name for t in self.tables]})")

    def table_weight(self, name: str) -> torch.Tensor:
        """A ``(rows, D)`` view of one table's weights, in their storage dtype (writes go through)."""
        g, t, cfg = self._locate(name)
        off = int(g.layout.weight_offsets[t])
        return g.weights[off : off + cfg.num_rows * cfg.dim].view(cfg.num_rows, cfg.dim)

    def table_optimizer_state(self, name: str) -> Dict[str, torch.Tensor]:
        """Views of one table's optimizer state: ``(rows, D)`` per element, ``(rows,)`` per row."""
        g, t, cfg = self._locate(name)
        out = {}
        for sname, s in zip(cfg.optimizer.type.state_names(), g.states):
            if cfg.optimizer.type.rowwise_state:
                r0 = int(g.layout.row_offsets[t])
                out[sname] = s[r0 : r0 + cfg.num_rows]
            else:
                off = int(g.layout.weight_offsets[t])
                out[sname] = s[off : off + cfg.num_rows * cfg.dim].view(cfg.num_rows, cfg.dim)
        return out

    def optimizer_steps(self) -> Dict[str, int]:
        """Updates applied so far, per table (tables of one group share the counter)."""
        return {cfg.name: int(g.step) for g in self.groups for cfg in g.layout.tables}

    def set_optimizer_steps(self, step: int, table: Optional[str] = None) -> None:
        """Set the update counter (Adam's and LAMB's bias correction) of every group, or of the
        group holding ``table``: restoring a checkpoint saved under another sharding."""
        for g in self.groups:
            if table is None or any(c.name == table for c in g.layout.tables):
                g.step.fill_(int(step))

    def set_learning_rate(self, lr: float, table: Optional[str] = None) -> None:
        """Set the sparse optimizer's learning rate of every group, or of the group holding ``table``."""
        for i, g in enumerate(self.groups):
            if table is None or any(c.name == table for c in g.layout.tables):
                self.learning_rates[i] = float(lr)
