"""Reference backend: plain PyTorch, written for clarity. The oracle of every other backend.

It loops over features and tables in Python and uses only stock tensor ops
(``index_select``, ``index_add_``, ``unique``), so that what it computes can be read off
the code. Its optimizer math (:func:`apply_optimizer`) and its stochastic rounding
(:func:`round_weights`, :func:`sr_uniform`) define the exact semantics the fast backends
reproduce.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from neo.config.embedding import OptimizerConfig, OptimizerType, WeightDType
from neo.embedding.layout import GroupLayout

# ----------------------------------------------------------------------------------------
# Counter-based random numbers for stochastic rounding.
# A 64-bit key per (seed, step, high half of the element index) from the splitmix64
# finalizer, then a 32-bit hash (lowbias32) of the low half of the index mixed with that key:
# the kernels compute the 64-bit part once per row and the 32-bit part eight or sixteen
# lanes at a time with 32-bit multiplies (kernels/round16.h).
# uint64 arithmetic is emulated on int64 tensors: multiplication wraps, shifts are logical.
_K_STEP = 0x9E3779B97F4A7C15
_K_HIGH = 0xD6E8FEB86659FD93
_K_MIX1 = 0xBF58476D1CE4E5B9
_K_MIX2 = 0x94D049BB133111EB
_K_LOW1 = 0x7FEB352D
_K_LOW2 = 0x846CA68B
_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def _lshr(z: torch.Tensor, k: int) -> torch.Tensor:
    return (z >> k) & ((1 << (64 - k)) - 1)


def sr_uniform(seed: int, step: int, elem_index: torch.Tensor) -> torch.Tensor:
    """Uniform fp32 numbers in [0, 1) with 24 random bits, one per flat weight element.

    With ``key = seed ^ step * K_STEP`` (mod 2^64) and the element index ``e = hi * 2^32 + lo``:
    ``k = splitmix64_finalizer(key ^ hi * K_HIGH)``, then ``z = lowbias32(lo ^ (k mod 2^32))``
    (32-bit); the top 24 bits of ``z``, times 2^-24.
    """
    key = _signed((seed & _MASK64) ^ ((step * _K_STEP) & _MASK64))
    e = elem_index.to(torch.int64)
    k = (_lshr(e, 32) * _signed(_K_HIGH)) ^ key
    k = (k ^ _lshr(k, 30)) * _signed(_K_MIX1)
    k = (k ^ _lshr(k, 27)) * _signed(_K_MIX2)
    k = k ^ _lshr(k, 31)
    z = (e ^ k) & _MASK32                       # 32-bit values held in int64: products stay exact mod 2^32
    z = ((z ^ (z >> 16)) * _K_LOW1) & _MASK32
    z = ((z ^ (z >> 15)) * _K_LOW2) & _MASK32
    z = z ^ (z >> 16)
    return (z >> 8).to(torch.float32) * (2.0 ** -24)


def _next_toward(r: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The 16-bit float next to ``r`` in the direction ``up`` (True: toward +inf)."""
    bits = r.view(torch.int16).to(torch.int32) & 0xFFFF
    mag, negative = bits & 0x7FFF, (bits & 0x8000) != 0
    away_from_zero = negative != up
    stepped = torch.where(away_from_zero, bits + 1, bits - 1)
    from_zero = torch.where(up, torch.ones_like(bits), torch.full_like(bits, 0x8001))
    new_bits = torch.where(mag == 0, from_zero, stepped)
    new_bits = torch.where(new_bits >= 0x8000, new_bits - 0x10000, new_bits)  # back to int16 range
    return new_bits.to(torch.int16).view(r.dtype)


def round_weights(x: torch.Tensor, dtype: WeightDType, stochastic: bool, u: Optional[torch.Tensor]) -> torch.Tensor:
    """Round fp32 ``x`` to the storage dtype: nearest-even, or stochastically with uniforms ``u``.

    Stochastic rounding picks the neighbour ``other`` of the nearest value ``r`` on the
    side of ``x`` with probability ``p = (x - r) / (other - r)``, which makes the rounding
    unbiased: ``E[out] = x``. The test ``u < p`` is computed as ``|u (other - r)| < |x - r|``
    in fp32: ``other - r`` is a power of two, so the product is exact (but where it falls
    below fp32's subnormals, bf16 weights under 2^-126) and no division is needed.
    """
    if dtype is WeightDType.FP32:
        return x
    r = x.to(dtype.torch_dtype)
    if not stochastic:
        return r
    r32 = r.to(torch.float32)
    diff = x - r32
    other = _next_toward(r, diff > 0)
    o32 = other.to(torch.float32)
    take = (diff != 0) & torch.isfinite(r32) & torch.isfinite(o32) & ((u * (o32 - r32)).abs() < diff.abs())
    return torch.where(take, other, r)


# ----------------------------------------------------------------------------------------
def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 square root (IEEE), whatever math library torch was built with.

    The square root of an fp32 value computed in fp64 and rounded once to fp32 is exactly
    the IEEE fp32 result; the C++ (``std::sqrt``) and Triton (``sqrt_rn``) backends compute
    the same value, so adaptive optimizers can match bit for bit.
    """
    return x.double().sqrt().float()


def apply_optimizer(
    opt: OptimizerConfig,
    w: torch.Tensor,            # (U, D) fp32, the touched rows
    g: torch.Tensor,            # (U, D) fp32, their aggregated gradients
    states: List[torch.Tensor], # per element (U, D) or per row (U,), fp32
    lr: float,
    step: int,
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """One sparse optimizer step on the touched rows; returns new (w, states). See OptimizerType."""
    kind, wd, eps = opt.type, opt.weight_decay, opt.eps
    if kind is not OptimizerType.LAMB and wd:
        g = g + wd * w
    if kind is OptimizerType.SGD:
        return w - lr * g, []
    if kind is OptimizerType.ADAGRAD:
        s = states[0] + g * g
        return w - lr * g / (_sqrt(s) + eps), [s]
    if kind is OptimizerType.ROWWISE_ADAGRAD:
        s = states[0] + (g * g).mean(dim=1)
        return w - (lr / (_sqrt(s) + eps)).unsqueeze(1) * g, [s]
    b1, b2 = opt.beta1, opt.beta2
    m = b1 * states[0] + (1 - b1) * g
    v = b2 * states[1] + (1 - b2) * g * g
    m_hat = m / (1 - b1 ** step)
    v_hat = v / (1 - b2 ** step)
    u = m_hat / (_sqrt(v_hat) + eps)
    if kind is OptimizerType.ADAM:
        return w - lr * u, [m, v]
    u = u + wd * w                                               # LAMB: decoupled decay
    w_norm = w.norm(dim=1, keepdim=True)
    u_norm = u.norm(dim=1, keepdim=True)
    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
    return w - lr * ratio * u, [m, v]


# ----------------------------------------------------------------------------------------
def _feature_slices(layout: GroupLayout, offsets: torch.Tensor, batch_size: int):
    """Per feature: (f, table index, D, columns, ids range, bag of each id (n,), bag lengths (B,))."""
    B = batch_size
    out_off = layout.output_offsets.tolist()
    for f, t in enumerate(layout.feature_table.tolist()):
        bag_off = offsets[f * B : (f + 1) * B + 1]
        lo, hi = int(bag_off[0]), int(bag_off[-1])
        lengths = bag_off[1:] - bag_off[:-1]                               # (B,)
        bag_of_id = torch.repeat_interleave(torch.arange(B, device=offsets.device), lengths)  # (n,)
        yield f, t, out_off[f], out_off[f + 1], lo, hi, bag_of_id, lengths


def _table_view(layout: GroupLayout, flat: torch.Tensor, t: int) -> torch.Tensor:
    rows, dim, off = int(layout.table_rows[t]), int(layout.table_dims[t]), int(layout.weight_offsets[t])
    return flat[off : off + rows * dim].view(rows, dim)                     # (rows, D)


_WEIGHT_GRAD_CHUNK = 1 << 16   # ids a (chunk, D) product of per_sample_weights_grad holds at once


def per_sample_weights_grad(layout: GroupLayout, weights: torch.Tensor, grad_output: torch.Tensor,
                            indices: torch.Tensor, offsets: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(N,) fp32: the gradient of the pooled lookup with respect to its per-id weights.

    Id ``i`` of bag ``b`` of feature ``f`` enters the output as ``w_i * row_i`` (sum pooling) or
    ``w_i * row_i / len(b)`` (mean), so ``d loss / d w_i = <row_i, grad_output[b, f's columns]>``,
    divided by ``len(b)`` under mean pooling; 0 for an id outside its table (it pooled nothing).
    ``row_i`` is read from ``weights`` as they are at the call: the backward calls this before its
    update, as FBGEMM's TBE does. The oracle of the cpu backend's kernel, and what every other
    backend uses (torch ops, any device); the tests check it against
    ``torch.nn.functional.embedding_bag`` and plain autograd.
    """
    B = batch_size
    out = torch.zeros(indices.numel(), dtype=torch.float32, device=weights.device)
    for f, t, c0, c1, lo, hi, bag_of_id, lengths in _feature_slices(layout, offsets, B):
        table = _table_view(layout, weights, t)                                 # (rows, D)
        g_bag = grad_output[:, c0:c1].to(torch.float32)                         # (B, D)
        if int(layout.feature_mean[f]):
            g_bag = g_bag / lengths.clamp(min=1).unsqueeze(1)
        for a in range(lo, hi, _WEIGHT_GRAD_CHUNK):
            z = min(hi, a + _WEIGHT_GRAD_CHUNK)
            ids = indices[a:z]
            valid = (ids >= 0) & (ids < table.shape[0])
            rows = table[ids.clamp(0, table.shape[0] - 1)].to(torch.float32)  # (n, D)
            dots = (rows * g_bag[bag_of_id[a - lo : z - lo]]).sum(dim=1)      # (n,)
            out[a:z] = torch.where(valid, dots, torch.zeros_like(dots))
    return out


class ReferenceBackend:
    name = "reference"

    def forward(self, layout, weights, indices, offsets, per_sample_weights, batch_size):
        B = batch_size
        out = torch.zeros(B, layout.total_dim, dtype=torch.float32, device=weights.device)
        for f, t, c0, c1, lo, hi, bag_of_id, lengths in _feature_slices(layout, offsets, B):
            table = _table_view(layout, weights, t)
            ids = indices[lo:hi]
            valid = (ids >= 0) & (ids < table.shape[0])
            rows = table[ids.clamp(0, table.shape[0] - 1)].to(torch.float32)   # (n, D)
            rows = rows * valid.unsqueeze(1)
            if per_sample_weights is not None:
                rows = rows * per_sample_weights[lo:hi].unsqueeze(1)
            pooled = torch.zeros(B, c1 - c0, dtype=torch.float32, device=weights.device)
            pooled.index_add_(0, bag_of_id, rows)                               # (B, D)
            if int(layout.feature_mean[f]):
                pooled = pooled / lengths.clamp(min=1).unsqueeze(1)
            out[:, c0:c1] = pooled
        return out

    def backward_update(self, layout, weights, states, grad_output, indices, offsets,
                        per_sample_weights, batch_size, lr, step, seed):
        B = batch_size
        opt = layout.optimizer
        ids_per_table: dict = {}
        for f, t, c0, c1, lo, hi, bag_of_id, lengths in _feature_slices(layout, offsets, B):
            g_bag = grad_output[:, c0:c1].to(torch.float32)                     # (B, D)
            if int(layout.feature_mean[f]):
                g_bag = g_bag / lengths.clamp(min=1).unsqueeze(1)
            g = g_bag[bag_of_id]                                                # (n, D)
            if per_sample_weights is not None:
                g = g * per_sample_weights[lo:hi].unsqueeze(1)
            ids = indices[lo:hi]
            valid = (ids >= 0) & (ids < int(layout.table_rows[t]))
            ids_per_table.setdefault(t, []).append((ids[valid], g[valid]))
        for t, parts in ids_per_table.items():
            ids = torch.cat([p[0] for p in parts])
            if ids.numel() == 0:
                continue
            grads = torch.cat([p[1] for p in parts])
            rows, inverse = torch.unique(ids, return_inverse=True)              # (U,), (n,)
            agg = torch.zeros(rows.numel(), grads.shape[1], dtype=torch.float32, device=grads.device)
            agg.index_add_(0, inverse, grads)                                   # (U, D) exact per-row sums
            table = _table_view(layout, weights, t)
            if opt.type.rowwise_state:
                r0 = int(layout.row_offsets[t])
                st_views = [s[r0 : r0 + table.shape[0]] for s in states]        # (rows,)
            else:
                st_views = [_table_view(layout, s, t) for s in states]          # (rows, D)
            w_new, st_new = apply_optimizer(
                opt, table[rows].to(torch.float32), agg, [s[rows] for s in st_views], lr, step
            )
            u = None
            if layout.stochastic_rounding and layout.dtype is not WeightDType.FP32:
                D = table.shape[1]
                elem = int(layout.weight_offsets[t]) + rows.unsqueeze(1) * D + torch.arange(D, device=rows.device)
                u = sr_uniform(seed, step, elem)
            table[rows] = round_weights(w_new, layout.dtype, layout.stochastic_rounding, u)
            for view, new in zip(st_views, st_new):
                view[rows] = new
