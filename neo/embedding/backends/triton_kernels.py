"""Triton kernels of the ``triton`` embedding backend (see :mod:`neo.embedding.backends.triton`).

Importing this module imports triton; :mod:`neo.embedding.backends.triton` imports it lazily,
so ``import neo`` works where triton is missing. Under ``TRITON_INTERPRET=1`` (set before
this module is first imported: triton picks compiled or interpreted kernels when it
decorates them) the same kernels run on CPU tensors.

Three kernels serve one group of tables (one flat weight buffer, see
:mod:`neo.embedding.layout`):

- :func:`pooled_forward_kernel`: a program per (feature, bag). It walks the bag's ids
  ``BLOCK_L`` at a time and gathers a ``(BLOCK_L, BLOCK_D)`` tile of rows (each row a
  contiguous, coalesced load; invalid ids masked off, never read), scales by the per-id
  weights, reduces over the ids in fp32 and writes ``out[b, out_off[f] : out_off[f] + D]``.
- :func:`row_keys_kernel`: a program per bag writes each id's global row key and its bag
  (the sort input of the grouping; the sort and segment starts are torch ops).
- :func:`fused_backward_update_kernel`: a program per ``BLOCK_S`` unique rows (segments of
  the ids sorted by global row). Per segment it derives the table, D and row address from
  the key and the first occurrence's feature; per occurrence, the gradient row address and
  the mean-pooling length from the bag. For each segment it sums
  the gradient of every occurrence in occurrence order (fp32), applies the optimizer to the
  row and writes weights and state back in place, rounding fp16/bf16 weights to nearest
  or stochastically. A row belongs to exactly one program: no atomics.

Bit-exactness with the reference (torch on CPU): the optimizer math uses IEEE division and
square root (``div_rn``, ``sqrt_rn``; Triton's ``/`` and ``sqrt`` are approximate on
NVIDIA GPUs), evaluates every expression in the reference's order, and the launcher turns
off FMA contraction (``enable_fp_fusion=False``). bf16 is converted with integer bit
operations (round to nearest even, as torch does) rather than with ``.to``: that is exact
on GPU and in the interpreter alike.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Optimizer codes (constexpr OPT).
OPT_SGD = 0
OPT_ADAGRAD = 1
OPT_ROWWISE_ADAGRAD = 2
OPT_ADAM = 3
OPT_LAMB = 4

# Weight storage codes (constexpr WKIND). bf16 buffers are passed as an int16 view.
W_FP32 = 0
W_FP16 = 1
W_BF16 = 2


# ----------------------------------------------------------------------------------------
# dtype helpers
@triton.jit
def _load_as_f32(raw, WKIND: tl.constexpr):
    """Loaded weights (fp32, fp16, or bf16 bits in int16) to fp32."""
    if WKIND == 2:
        return ((raw.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    else:
        return raw.to(tl.float32)


@triton.jit
def _bits16_to_f32(bits, WKIND: tl.constexpr):
    """16-bit pattern (int32 in [0, 0xFFFF]) of an fp16/bf16 value to fp32."""
    if WKIND == 1:
        return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        return (bits << 16).to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bits16(x, WKIND: tl.constexpr):
    """fp32 rounded to nearest even in fp16/bf16; its bit pattern as int32 in [0, 0xFFFF]."""
    if WKIND == 1:
        return x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    else:
        u = x.to(tl.uint32, bitcast=True)
        r = (u + (((u >> 16) & 1) + 0x7FFF)) >> 16          # torch's round_to_nearest_even
        r = tl.where(x != x, 0x7FC0, r.to(tl.int32))        # NaN stays a (quiet) NaN
        return r & 0xFFFF


@triton.jit
def _sr_uniform(key, elem):
    """neo.embedding.backends.reference.sr_uniform: (key, element) -> [0, 1).

    A 64-bit key of (key, high half of elem) by the splitmix64 finalizer, then lowbias32 of
    the low half with that key's low 32 bits."""
    e = elem.to(tl.uint64, bitcast=True)
    k = (e >> 32) * 0xD6E8FEB86659FD93
    k = k ^ key
    k = (k ^ (k >> 30)) * 0xBF58476D1CE4E5B9
    k = (k ^ (k >> 27)) * 0x94D049BB133111EB
    k = k ^ (k >> 31)
    z = ((e ^ k) & 0xFFFFFFFF).to(tl.uint32)
    z = (z ^ (z >> 16)) * 0x7FEB352D
    z = (z ^ (z >> 15)) * 0x846CA68B
    z = z ^ (z >> 16)
    return (z >> 8).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08  # 2^-24


@triton.jit
def _round_to_storage(x, elem, sr_key, WKIND: tl.constexpr, SR: tl.constexpr):
    """reference.round_weights for fp16/bf16: bit pattern (int32) of the stored value."""
    bits = _f32_to_bits16(x, WKIND)
    if SR:
        r32 = _bits16_to_f32(bits, WKIND)
        diff = x - r32
        up = diff > 0
        mag = bits & 0x7FFF
        negative = (bits & 0x8000) != 0
        away_from_zero = negative != up
        stepped = tl.where(away_from_zero, bits + 1, bits - 1)
        from_zero = tl.where(up, 1, 0x8001)
        other = tl.where(mag == 0, from_zero, stepped) & 0xFFFF
        o32 = _bits16_to_f32(other, WKIND)
        u = _sr_uniform(sr_key, elem)
        inf = float("inf")
        # u < (x - r) / (other - r), as |u (other - r)| < |x - r|: other - r is a power of two
        take = (diff != 0) & (tl.abs(r32) < inf) & (tl.abs(o32) < inf) & (tl.abs(u * (o32 - r32)) < tl.abs(diff))
        bits = tl.where(take, other, bits)
    return bits


# ----------------------------------------------------------------------------------------
@triton.jit
def pooled_forward_kernel(
    weights_ptr,          # (sum rows * D,) fp32 / fp16 / int16 (bf16 bits)
    indices_ptr,          # (N,) int64
    offsets_ptr,          # (F * B + 1,) int64
    psw_ptr,              # (N,) fp32, or a dummy when HAS_PSW is False
    out_ptr,              # (B, total_dim) fp32
    feature_table_ptr, table_rows_ptr, table_dims_ptr, weight_offsets_ptr,
    output_offsets_ptr, feature_mean_ptr,
    invalid_ptr,          # (F,) int32: each feature's invalid ids added in, or a dummy when COUNT is False
    B, total_dim,
    HAS_PSW: tl.constexpr,
    WKIND: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COUNT: tl.constexpr,
):
    pid = tl.program_id(0)                      # bag f * B + b
    f = pid // B
    b = pid - f * B
    t = tl.load(feature_table_ptr + f)
    rows = tl.load(table_rows_ptr + t)
    # D is a multiple of 4 (TableConfig checks), hence so are w_off and col0: the hints let
    # the row loads and the output store use 16-byte (fp32) / 8-byte (16-bit) vectors
    D = tl.multiple_of(tl.load(table_dims_ptr + t), 4)
    w_off = tl.multiple_of(tl.load(weight_offsets_ptr + t), 4)
    col0 = tl.multiple_of(tl.load(output_offsets_ptr + f), 4)
    is_mean = tl.load(feature_mean_ptr + f)
    start = tl.load(offsets_ptr + pid)
    end = tl.load(offsets_ptr + pid + 1)

    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    n_invalid = tl.zeros([BLOCK_L], dtype=tl.int32)                # per lane of the id tile
    for i0 in range(start, end, BLOCK_L):
        pos = i0 + tl.arange(0, BLOCK_L)
        l_mask = pos < end
        ids = tl.load(indices_ptr + pos, mask=l_mask, other=-1)
        valid = l_mask & (ids >= 0) & (ids < rows)
        if COUNT:
            n_invalid += (l_mask & ~valid).to(tl.int32)
        ids = tl.where(valid, ids, 0)                              # never form a wild address
        row = tl.multiple_of(w_off + ids * D, 4)                   # int64 element offsets
        raw = tl.load(weights_ptr + row[:, None] + d[None, :],
                      mask=valid[:, None] & d_mask[None, :], other=0.0)
        vals = _load_as_f32(raw, WKIND)
        if HAS_PSW:
            s = tl.load(psw_ptr + pos, mask=l_mask, other=0.0)
            vals = vals * s[:, None]
        acc += tl.sum(vals, axis=0)
    n = tl.maximum(end - start, 1).to(tl.float32)
    acc = tl.where(is_mean != 0, tl.div_rn(acc, tl.zeros_like(acc) + n), acc)  # div_rn: no implicit broadcast
    tl.store(out_ptr + b.to(tl.int64) * total_dim + col0 + d, acc, mask=d_mask)
    if COUNT:   # one atomic add per bag that has invalid ids (integers: the total is exact in any order)
        bad = tl.sum(n_invalid, axis=0)
        tl.atomic_add(invalid_ptr + f, bad, mask=bad > 0)


# ----------------------------------------------------------------------------------------
@triton.jit
def row_keys_kernel(
    indices_ptr,          # (N,) int64
    offsets_ptr,          # (F * B + 1,) int64
    key_ptr,              # (N,) int32 or int64 out: global row row_offsets[t] + id; total_rows if invalid
    bag_ptr,              # (N,) int32 out: the id's bag f * B + b
    feature_table_ptr, table_rows_ptr, row_offsets_ptr,
    B, total_rows,
    BLOCK_L: tl.constexpr,
):
    """Grouping step 1 (a program per bag): the sort key and the bag of every id."""
    pid = tl.program_id(0)                      # bag f * B + b
    f = pid // B
    t = tl.load(feature_table_ptr + f)
    rows = tl.load(table_rows_ptr + t)
    r0 = tl.load(row_offsets_ptr + t)
    start = tl.load(offsets_ptr + pid)
    end = tl.load(offsets_ptr + pid + 1)
    for i0 in range(start, end, BLOCK_L):
        pos = i0 + tl.arange(0, BLOCK_L)
        l_mask = pos < end
        ids = tl.load(indices_ptr + pos, mask=l_mask, other=-1)
        valid = (ids >= 0) & (ids < rows)
        key = tl.where(valid, r0 + ids, total_rows)
        tl.store(key_ptr + pos, key, mask=l_mask)                  # store casts to the key dtype
        tl.store(bag_ptr + pos, tl.zeros_like(pos).to(tl.int32) + pid, mask=l_mask)


@triton.jit(do_not_specialize=["sr_key"])
def fused_backward_update_kernel(
    weights_ptr,          # (sum rows * D,) fp32 / fp16 / int16 (bf16 bits), updated in place
    state0_ptr,           # fp32 optimizer state (sum / exp_avg), or a dummy
    state1_ptr,           # fp32 exp_avg_sq, or a dummy
    grad_ptr,             # (B, total_dim) fp32
    seg_start_ptr,        # (N + 1,) int64: first sorted position of segment s; N past the last
    num_segs_ptr,         # (1,) int64, number of segments (device scalar: no host sync)
    key_ptr,              # (N,) int32/int64 sorted global rows; invalid ids carry total_rows
    bag_ptr,              # (N,) int32 bag f * B + b of each sorted id
    psw_ptr,              # (N,) fp32 per-id weights in sorted order (dummy when HAS_PSW is False)
    offsets_ptr,          # (F * B + 1,) int64 bag boundaries (mean pooling divides by the length)
    feature_table_ptr, table_dims_ptr, weight_offsets_ptr, row_offsets_ptr,
    output_offsets_ptr, feature_mean_ptr,
    B, total_dim, total_rows,
    lr, eps, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
    bias_corr1, bias_corr2,
    sr_key,               # (seed ^ step * K_STEP) mod 2^64, as a signed int64
    OPT: tl.constexpr,
    WKIND: tl.constexpr,
    SR: tl.constexpr,
    HAS_PSW: tl.constexpr,
    HAS_WD: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grouping step 3: a program per BLOCK_S segments (unique rows) of the sorted ids."""
    pid = tl.program_id(0)
    num_segs = tl.load(num_segs_ptr)
    seg = pid * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = seg < num_segs
    first = tl.load(seg_start_ptr + seg, mask=s_mask, other=0)
    last = tl.load(seg_start_ptr + seg + 1, mask=s_mask, other=0)
    key = tl.load(key_ptr + first, mask=s_mask, other=total_rows).to(tl.int64)
    s_mask = s_mask & (key < total_rows)                           # drop the invalid-id segment
    count = tl.where(s_mask, last - first, 0)
    # the row's table, from the feature of its first occurrence
    bag0 = tl.load(bag_ptr + first, mask=s_mask, other=0)
    t = tl.load(feature_table_ptr + bag0 // B, mask=s_mask, other=0)
    # D % 4 == 0 (TableConfig checks): alignment hints for vectorised row loads and stores
    D = tl.multiple_of(tl.load(table_dims_ptr + t, mask=s_mask, other=0), 4)
    r0 = tl.load(row_offsets_ptr + t, mask=s_mask, other=0)
    w0 = tl.multiple_of(tl.load(weight_offsets_ptr + t, mask=s_mask, other=0), 4)
    wrow = tl.multiple_of(w0 + (key - r0) * D, 4)                  # int64 first element of the row

    d = tl.arange(0, BLOCK_D)
    mask = s_mask[:, None] & (d[None, :] < D[:, None])            # (BLOCK_S, BLOCK_D)
    elem = wrow[:, None] + d[None, :]                              # int64 flat element index
    w_ptrs = weights_ptr + elem
    # row and state loads are issued before the gradient loop, so their latency overlaps it
    w = _load_as_f32(tl.load(w_ptrs, mask=mask, other=0.0), WKIND)
    if OPT == 1:
        s = tl.load(state0_ptr + elem, mask=mask, other=0.0)
    elif OPT == 2:
        s = tl.load(state0_ptr + key, mask=s_mask, other=0.0)
    elif OPT >= 3:
        m = tl.load(state0_ptr + elem, mask=mask, other=0.0)
        v = tl.load(state1_ptr + elem, mask=mask, other=0.0)

    # gradient of each row: sum over its occurrences, in occurrence order
    g = tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.float32)
    max_count = tl.max(count, axis=0)
    for k in range(0, max_count):
        k_mask = k < count
        pos = first + k
        bag = tl.load(bag_ptr + pos, mask=k_mask, other=0)
        f = bag // B
        b = bag - f * B
        col0 = tl.multiple_of(tl.load(output_offsets_ptr + f, mask=k_mask, other=0), 4)
        is_mean = tl.load(feature_mean_ptr + f, mask=k_mask, other=0)
        o0 = tl.load(offsets_ptr + bag, mask=k_mask & (is_mean != 0), other=0)
        o1 = tl.load(offsets_ptr + bag + 1, mask=k_mask & (is_mean != 0), other=1)
        n = tl.maximum(o1 - o0, 1).to(tl.float32)                  # 1 for sum pooling
        grow = tl.multiple_of(b.to(tl.int64) * total_dim + col0, 4)
        go = tl.load(grad_ptr + grow[:, None] + d[None, :], mask=k_mask[:, None] & mask, other=0.0)
        term = tl.div_rn(go, tl.broadcast_to(n[:, None], (BLOCK_S, BLOCK_D)))
        if HAS_PSW:
            p = tl.load(psw_ptr + pos, mask=k_mask, other=0.0)
            term = term * p[:, None]
        g += term

    if HAS_WD:
        if OPT != 4:
            g = g + weight_decay * w                               # L2 on the gradient

    if OPT == 0:                                                   # sgd
        w_new = w - lr * g
    elif OPT == 1:                                                 # adagrad
        s = s + g * g
        w_new = w - tl.div_rn(lr * g, tl.sqrt_rn(s) + eps)
        tl.store(state0_ptr + elem, s, mask=mask)
    elif OPT == 2:                                                 # rowwise adagrad
        mean_sq = tl.div_rn(tl.sum(g * g, axis=1), tl.maximum(D, 1).to(tl.float32))
        s = s + mean_sq
        den = tl.sqrt_rn(s) + eps
        step_size = tl.div_rn(tl.full(den.shape, 1.0, tl.float32), den) * lr  # torch: lr / x == x.reciprocal() * lr
        w_new = w - step_size[:, None] * g
        tl.store(state0_ptr + key, s, mask=s_mask)
    else:                                                          # adam, lamb
        m = beta1 * m + one_minus_beta1 * g
        v = beta2 * v + one_minus_beta2 * g * g
        m_hat = tl.div_rn(m, tl.zeros_like(m) + bias_corr1)
        v_hat = tl.div_rn(v, tl.zeros_like(v) + bias_corr2)
        u = tl.div_rn(m_hat, tl.sqrt_rn(v_hat) + eps)
        if OPT == 3:
            w_new = w - lr * u
        else:
            u = u + weight_decay * w                               # decoupled decay
            w_norm = tl.sqrt_rn(tl.sum(w * w, axis=1))
            u_norm = tl.sqrt_rn(tl.sum(u * u, axis=1))
            ok = (w_norm > 0) & (u_norm > 0)
            ratio = tl.where(ok, tl.div_rn(w_norm, tl.where(ok, u_norm, 1.0)), 1.0)
            w_new = w - (lr * ratio)[:, None] * u
        tl.store(state0_ptr + elem, m, mask=mask)
        tl.store(state1_ptr + elem, v, mask=mask)

    if WKIND == 0:
        tl.store(w_ptrs, w_new, mask=mask)
    else:
        key64 = sr_key.to(tl.int64).to(tl.uint64, bitcast=True)
        bits = _round_to_storage(w_new, elem, key64, WKIND, SR)
        if WKIND == 1:
            tl.store(w_ptrs, bits.to(tl.int16).to(tl.float16, bitcast=True), mask=mask)
        else:
            tl.store(w_ptrs, bits.to(tl.int16), mask=mask)
