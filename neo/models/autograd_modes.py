"""When Neo's fused autograd Functions may run: plain reverse-mode autograd only.

The fused layers (the dot interaction's C++ node, the MLP's linear and bias + ReLU Functions)
define a forward and a backward and nothing else: no vmap rule for torch.func's transforms
(grad, vmap, jacrev) and no jvp for forward-mode AD (``torch.autograd.forward_ad``'s dual
tensors, ``torch.func.jvp``, ``jacfwd``, ``hessian``). Under either, the modules take their
torch paths instead, which have both.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as forward_ad


def plain_autograd() -> bool:
    """True outside torch.func's transforms and outside a forward-mode AD dual level."""
    # forward_ad keeps its one active dual level in a module global (-1: none); a torch without
    # it fails the forward-mode tests, not training
    return not torch._C._are_functorch_transforms_active() and getattr(forward_ad, "_current_level", -1) < 0
