"""A :class:`~neo.embedding.TableBatchedEmbedding`'s state dict, by table: each table's weight,
optimizer state and step counter under ``TABLE.weight``, ``TABLE.<state>``, ``TABLE.step`` (as
TorchRec names ``embedding_bags.TABLE.weight``), saved as views of the live buffers (a cached
table: its whole backing store) and loaded with every mismatch named by table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

import torch

from neo.config.embedding import OptimizerType, TableConfig

if TYPE_CHECKING:
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["table_entries", "save_tables", "load_tables"]


def table_entries(emb: "TableBatchedEmbedding", cfg: TableConfig) -> Dict[str, torch.Tensor]:
    """One table's state-dict entries (views): ``weight`` (rows, D) in its storage dtype, its
    optimizer state by name ((rows, D) per element, (rows,) per row) and ``step`` (its group's
    update counter)."""
    g, t, cfg = emb._locate(cfg.name)
    if cfg.cached:              # the whole backing store, the cache's dirty rows written back to it
        emb._cache.flush()
        store = emb._cache.caches[cfg.name].store
        weight, states = store.weights, store.states
    else:
        weight, states = g.table_slots(t), g.table_state_slots(t)
    return {"weight": weight, **dict(zip(cfg.optimizer.type.state_names(), states)), "step": g.step}


def save_tables(emb: "TableBatchedEmbedding", destination: Dict[str, Any], prefix: str, keep_vars: bool) -> None:
    for cfg in emb.tables:
        for key, value in table_entries(emb, cfg).items():
            destination[f"{prefix}{cfg.name}.{key}"] = value if keep_vars else value.detach()


def _disagreeing_steps(emb: "TableBatchedEmbedding", state_dict: Dict[str, Any], prefix: str) -> List[str]:
    """A group's tables share one step counter; where it counts (Adam's and LAMB's bias
    correction) their saved steps must agree, not the last one loaded win: a message per group
    whose saved steps differ."""
    msgs = []
    for g in emb.groups:
        if g.layout.optimizer.type not in (OptimizerType.ADAM, OptimizerType.LAMB):
            continue
        steps = {c.name: int(state_dict[f"{prefix}{c.name}.step"]) for c in g.layout.tables
                 if isinstance(state_dict.get(f"{prefix}{c.name}.step"), torch.Tensor)
                 and state_dict[f"{prefix}{c.name}.step"].numel() == 1}
        if len(set(steps.values())) > 1:
            msgs.append(f"tables {sorted(steps)} share one optimizer step counter here (one fused update), but "
                        f"their saved steps differ: {dict(sorted(steps.items()))}; load the state dict without its "
                        f"'.step' entries (strict=False), then choose the step with set_optimizer_steps")
    return msgs


def load_tables(emb: "TableBatchedEmbedding", state_dict: Dict[str, Any], prefix: str, missing_keys: List[str],
                unexpected_keys: List[str], error_msgs: List[str]) -> None:
    """Copy each table's entries of ``state_dict`` into the live buffers (``nn.Module``'s
    ``_load_from_state_dict`` protocol: what is missing, unexpected or wrong goes to its lists)."""
    if emb._cache is not None:
        if emb._cache.in_flight:
            error_msgs.append(f"{emb._cache.in_flight} prefetched batch(es) are in flight: finish their steps "
                              "before loading a state dict into cached tables")
            ours = tuple(f"{prefix}{cfg.name}." for cfg in emb.tables)      # the reason, not "unexpected"
            unexpected_keys[:] = [k for k in unexpected_keys if not k.startswith(ours)]
            return
        emb._cache.drop()      # every row back in its store and out of the cache: the store is the table
    error_msgs.extend(_disagreeing_steps(emb, state_dict, prefix))
    mine = set()
    for cfg in emb.tables:
        for key, dst in table_entries(emb, cfg).items():
            name = f"{prefix}{cfg.name}.{key}"
            mine.add(name)
            if name not in state_dict:
                missing_keys.append(name)
                continue
            src = state_dict[name]
            if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
                what = (f"{tuple(src.shape)} {src.dtype}" if isinstance(src, torch.Tensor) else type(src).__name__)
                error_msgs.append(f"table '{cfg.name}': {name} is {what} in the state dict, "
                                  f"{tuple(dst.shape)} {dst.dtype} here ({cfg.num_rows} rows x dim {cfg.dim}, "
                                  f"{cfg.dtype.value}, {cfg.optimizer.type.value})")
                continue
            with torch.no_grad():
                dst.copy_(src)
    unexpected_keys[:] = [k for k in unexpected_keys if k not in mine]
    if any(k.startswith(f"{prefix}group") and k.endswith("_weights") for k in state_dict):
        error_msgs.append("this state dict holds group buffers (group0_weights, ...) from an older Neo; "
                          "save it again with that version's table_weight / table_optimizer_state per table")
