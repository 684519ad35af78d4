"""Stochastic rounding: the int64-emulated hash against a pure-Python uint64 oracle, and unbiasedness."""

import pytest
import torch

from neo.config.embedding import WeightDType
from neo.embedding.backends.reference import round_weights, sr_uniform

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1


def py_uniform(seed: int, step: int, elem: int) -> float:
    """The definition on Python integers: splitmix64 of (key, high half), lowbias32 of the low half."""
    k = ((seed & M64) ^ ((step * 0x9E3779B97F4A7C15) & M64)) ^ (((elem >> 32) * 0xD6E8FEB86659FD93) & M64)
    k = ((k ^ (k >> 30)) * 0xBF58476D1CE4E5B9) & M64
    k = ((k ^ (k >> 27)) * 0x94D049BB133111EB) & M64
    k ^= k >> 31
    z = (elem ^ k) & M32
    z = ((z ^ (z >> 16)) * 0x7FEB352D) & M32
    z = ((z ^ (z >> 15)) * 0x846CA68B) & M32
    z ^= z >> 16
    return (z >> 8) / float(1 << 24)


def test_hash_matches_uint64_oracle():
    elems = torch.tensor([0, 1, 2, 12345, 2**31 + 7, 2**32 - 1, 2**32, 2**40 + 3, 2**62 + 11, 2**63 - 1])
    for seed, step in [(0, 1), (7, 3), (2**63 + 5, 2**20)]:
        got = sr_uniform(seed, step, elems).tolist()
        assert got == [py_uniform(seed, step, int(e)) for e in elems]


def test_uniforms_look_uniform():
    u = sr_uniform(1, 1, torch.arange(200_000))
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert torch.all((hist - 0.1).abs() < 0.005)


@pytest.mark.parametrize("dtype", [WeightDType.FP16, WeightDType.BF16])
@pytest.mark.parametrize("x", [0.1, -0.1, 1.0 / 3.0, -2.7183, 1e-6, 300.123])
def test_unbiased_and_adjacent(dtype, x):
    n = 100_000
    xs = torch.full((n,), x, dtype=torch.float32)
    out = round_weights(xs, dtype, True, sr_uniform(5, 1, torch.arange(n))).float()
    values = torch.unique(out)
    assert values.numel() <= 2
    lo, hi = float(values.min()), float(values.max())
    assert lo <= x <= hi
    if values.numel() == 2:   # the two neighbours are adjacent in the 16-bit format
        between = torch.linspace(lo, hi, 9)[1:-1].to(dtype.torch_dtype).float()
        assert torch.all((between == lo) | (between == hi))
    spacing = hi - lo
    assert abs(float(out.double().mean()) - x) < 4 * spacing / n ** 0.5 + 1e-12


def test_exact_values_stay_and_nearest_mode():
    xs = torch.tensor([0.5, -0.25, 0.0, 1024.0])
    u = torch.rand(4)
    for dt in (WeightDType.FP16, WeightDType.BF16):
        assert torch.equal(round_weights(xs, dt, True, u).float(), xs)
    y = torch.tensor([0.1])
    assert torch.equal(round_weights(y, WeightDType.FP16, False, None), y.half())
