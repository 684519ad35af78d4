"""The embedding module's one parameter, ``autograd_anchor``: an empty tensor.

The tables are buffers, updated in place by the fused backward, so a lookup's autograd node needs
an input that requires grad for autograd to call that backward: the anchor (FBGEMM's TBE has such
a placeholder parameter). Being the module's parameter, it is what ``requires_grad_(False)`` on the
module or any parent, and ``p.requires_grad = False`` over its ``parameters()``, reach: its flag
is whether the tables train (``TableBatchedEmbedding.frozen``). Left out of the state dict. A
``ShardedEmbeddingCollection`` registers one and lends it to its local module (:func:`share_anchor`),
so that every rank has the same parameters whatever shards it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["ANCHOR", "anchor_grad", "new_anchor", "restore_anchor", "share_anchor"]

ANCHOR = "autograd_anchor"


def new_anchor(device: Optional[torch.device | str], requires_grad: bool = True) -> nn.Parameter:
    return nn.Parameter(torch.zeros(0, device=device), requires_grad=requires_grad)


def anchor_grad(ctx, owner: "TableBatchedEmbedding") -> Optional[torch.Tensor]:
    """The gradient of ``owner.autograd_anchor``, a lookup's first input: empty where it requires
    grad, as any parameter a forward used gets one (``torch.autograd.grad`` over ``parameters()``
    and optimizers' state then treat it as one); else None."""
    return torch.zeros_like(owner.autograd_anchor) if ctx.needs_input_grad[0] else None


def share_anchor(module: nn.Module, anchor: nn.Parameter) -> None:
    """``module`` uses ``anchor``, a parameter registered on the module holding it, as its own."""
    del module._parameters[ANCHOR]
    object.__setattr__(module, ANCHOR, anchor)      # an attribute, not a parameter


def restore_anchor(module: nn.Module, device: torch.device) -> None:
    """After unpickling: a module pickled by an older Neo has no anchor (its ``frozen``, if set,
    was an attribute)."""
    if ANCHOR not in module._parameters and ANCHOR not in module.__dict__:
        setattr(module, ANCHOR, new_anchor(device, requires_grad=not module.__dict__.pop("frozen", False)))
