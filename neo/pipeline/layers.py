"""The dense part of DLRM / DCNv2 as a flat list of layers: the unit of profiling and of pipeline stages.

The embedding lookup is not part of the dense pipeline: its pooled output ``(B, F * D)`` enters
the first layer beside the dense features, and the bottom MLP's layers carry it, untouched, to
the interaction. Layers, in forward order (``dot``: DLRM; ``dcn``: DCNv2)::

    name              input (a tuple)            output (a tuple)           parameters
    bottom.{k}        (x (B, in), pooled)        (relu(x W^T + b), pooled)  Linear k of model.dense_arch
    interaction       (x (B, D), pooled)         dot: (z (B, D + (F+1)F/2),)   none
                                                 dcn: (x0 (B, N),)  x0 = [x, pooled], N = (F+1) D
    interaction.{l}   dcn only: (x0,) for l = 0, else (x0, x_l)
                                                 (x0, x_{l+1}); the last cross layer: (x_{l+1},)
                                                 x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l
    top.{k}           (z (B, in),)               (relu(z W^T + b),); the last: (logit (B,),)

**Calling convention.** Every layer is an ``nn.Module`` called with the tensors of its input
tuple as positional arguments and returning a tuple of tensors: the next layer's arguments.
``layer(*acts) -> acts``; the first takes ``(dense (B, num_dense), pooled (B, F * D))``, the last
returns ``(logits (B,),)``. A pipeline stage is a contiguous slice, :class:`LayerStack`; the
tuple a stage returns is what it sends to the next stage (and its gradient what comes back),
so a layer's ``activation_bytes`` in a profile is the size of its output tuple. Worked example
(``train_tiny``: 4 dense features, dense_arch [16, 8], F = 4, D = 8, over_arch [16, 1], B = 128)::

    bottom.0     (dense (128, 4),  pooled (128, 32)) -> ((128, 16), (128, 32))
    bottom.1     ((128, 16), (128, 32))              -> ((128, 8),  (128, 32))
    interaction  ((128, 8),  (128, 32))              -> ((128, 18),)      18 = 8 + 5*4/2
    top.0        ((128, 18),)                        -> ((128, 16),)
    top.1        ((128, 16),)                        -> ((128,),)         the logits

:func:`layers_of` cuts an existing :class:`~neo.models.dlrm.DLRM` into these layers (they share
its parameters: ``LayerStack(layers_of(m))(dense, pooled)[0]`` equals ``m.head(dense, pooled)``);
:func:`dense_layers` builds a fresh model from a config and cuts it.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from neo.models.dlrm import DLRM
from neo.models.interaction import DotInteraction, LowRankCrossNet, as_tensor
from neo.models.mlp import linear_activation

__all__ = ["dense_layers", "layers_of", "LayerStack", "split_stages",
           "BottomLayer", "InteractionLayer", "CrossInput", "CrossLayer", "TopLayer"]

Acts = Tuple[torch.Tensor, ...]


class BottomLayer(nn.Module):
    """One bottom-MLP layer: ``(x, pooled) -> (act(linear(x)), pooled)``; ``pooled`` passes through."""

    def __init__(self, linear: nn.Module, activation: Optional[nn.Module]):
        super().__init__()
        self.linear, self.activation = linear, activation

    def forward(self, x: torch.Tensor, pooled: torch.Tensor) -> Acts:
        return (linear_activation(self.linear, self.activation, x), pooled)   # (B, out)


class InteractionLayer(nn.Module):
    """DLRM's dot interaction: ``(x (B, D), pooled (B, F * D)) -> (z (B, D + (F+1)F/2),)``."""

    def __init__(self, interaction: DotInteraction):
        super().__init__()
        self.interaction = interaction

    def forward(self, x: torch.Tensor, pooled: torch.Tensor) -> Acts:
        return (self.interaction(x, pooled),)


class CrossInput(nn.Module):
    """DCNv2's cross-network input: ``(x (B, D), pooled (B, F * D)) -> (x0 (B, N),)``, N = (F + 1) D."""

    def forward(self, x: torch.Tensor, pooled: torch.Tensor) -> Acts:
        return (torch.cat([x, as_tensor(pooled)], dim=1),)  # (B, N)


class CrossLayer(nn.Module):
    """Cross layer l of DCNv2: ``x_{l+1} = x0 * up(down(x_l)) + x_l`` (Wang et al. 2021, eq. 1, W = U V).

    Input ``(x0,)`` for the first layer (x_0 = x0), ``(x0, x_l)`` after; output ``(x0, x_{l+1})``,
    or ``(x_{l+1},)`` for the last layer (nothing after it needs x0).
    """

    def __init__(self, down: nn.Module, up: nn.Module, last: bool):
        super().__init__()
        self.down, self.up, self.last = down, up, last

    def forward(self, x0: torch.Tensor, x: Optional[torch.Tensor] = None) -> Acts:
        x = x0 if x is None else x
        y = x0 * self.up(self.down(x)) + x                  # (B, N)
        return (y,) if self.last else (x0, y)


class TopLayer(nn.Module):
    """One top-MLP layer: ``(z,) -> (act(linear(z)),)``; the last layer returns the logits ``(B,)``."""

    def __init__(self, linear: nn.Module, activation: Optional[nn.Module], squeeze: bool):
        super().__init__()
        self.linear, self.activation, self.squeeze = linear, activation, squeeze

    def forward(self, z: torch.Tensor) -> Acts:
        y = linear_activation(self.linear, self.activation, z)   # (B, out)
        return (y.squeeze(1),) if self.squeeze else (y,)    # (B,) or (B, out)


def layers_of(model: DLRM) -> List[Tuple[str, nn.Module]]:
    """The dense layers of ``model`` in forward order, sharing its parameters (module docstring)."""
    out: List[Tuple[str, nn.Module]] = []
    for k, (lin, act) in enumerate(model.bottom.layer_pairs()):
        out.append((f"bottom.{k}", BottomLayer(lin, act)))
    inter = model.interaction
    if isinstance(inter, DotInteraction):
        out.append(("interaction", InteractionLayer(inter)))
    elif isinstance(inter, LowRankCrossNet):
        out.append(("interaction", CrossInput()))
        n = len(inter.down)
        for l, (down, up) in enumerate(zip(inter.down, inter.up)):
            out.append((f"interaction.{l}", CrossLayer(down, up, last=l == n - 1)))
    else:
        raise TypeError(f"layers_of: unknown interaction module {type(inter).__name__}")
    top = model.top.layer_pairs()
    for k, (lin, act) in enumerate(top):
        out.append((f"top.{k}", TopLayer(lin, act, squeeze=k == len(top) - 1)))
    return out


def dense_layers(model_cfg, num_dense: int, num_features: int, dim: int) -> List[Tuple[str, nn.Module]]:
    """The dense layers of a fresh DLRM / DCNv2 built from ``model_cfg``
    (:class:`neo.config.model.ModelConfig`), in forward order; initialised as :class:`DLRM`
    initialises them (seed torch first for reproducible weights).

    Args:
        model_cfg: the config's ``model`` section.
        num_dense: dense input features (the data's; 13 for Criteo).
        num_features: F, pooled embedding features.
        dim: D, every feature's embedding dimension (``model_cfg.dense_arch`` ends in it).
    """
    model = DLRM(nn.Identity(), num_features, dim, num_dense, [int(s) for s in model_cfg.dense_arch],
                 [int(s) for s in model_cfg.over_arch], str(model_cfg.interaction),
                 int(model_cfg.dcn_layers), int(model_cfg.dcn_rank))
    return layers_of(model)


class LayerStack(nn.Module):
    """A contiguous run of layers (a pipeline stage): ``forward(*acts) -> acts``, each layer's output
    tuple unpacked into the next. ``names`` keeps the layers' names."""

    def __init__(self, layers: Sequence[Tuple[str, nn.Module]]):
        super().__init__()
        if not layers:
            raise ValueError("LayerStack needs at least one layer")
        self.names = [name for name, _ in layers]
        self.layers = nn.ModuleList(m for _, m in layers)

    def forward(self, *acts: torch.Tensor) -> Acts:
        for layer in self.layers:
            acts = layer(*acts)
        return acts


def split_stages(layers: Sequence[Tuple[str, nn.Module]], stages: Sequence[Tuple[int, int]]) -> List[LayerStack]:
    """One :class:`LayerStack` per ``[first, last]`` (inclusive) layer range, e.g. ``Partition.stages``."""
    return [LayerStack(layers[first:last + 1]) for first, last in stages]
