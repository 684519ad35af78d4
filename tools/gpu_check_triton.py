#!/usr/bin/env python
"""Check and time the triton embedding backend on a CUDA GPU (H100/H200).

    python tools/gpu_check_triton.py                  # correctness, then timings
    python tools/gpu_check_triton.py --skip-correctness --sweep   # timings + launch-config sweep
    python tools/gpu_check_triton.py --compile-only   # no GPU needed: compile for sm_90, inspect PTX
    python tools/gpu_check_triton.py --dims 64,128,256 --profile   # timings at three D; the module's time split

1. Correctness on realistic shapes (mixed D from 4 to 256, sum and mean pooling, a table
   read by two features, hot rows, long bags, per-id weights): every optimizer, fp32 and
   fp16/bf16 with stochastic rounding on and off, trained on CUDA against the reference on
   CPU, step by step. fp32: 1e-5 relative. 16-bit weights: bit-exact for sgd/adagrad/adam,
   at most 1 ulp for rowwise_adagrad/lamb (their row reductions cannot match torch's CPU
   reduction order), or, where the update nearly cancels the weight, within 1 ulp (2 with
   stochastic rounding) plus 2^-20 of |w before| + |update| (``_cancellation``). Also: ids
   past 2^31 weight elements (int64 address math) and the PTX of the fused kernel (no FMA
   contraction, IEEE div/sqrt, vectorised row loads).
2. Timings of the default workload (8 tables x 1M rows, D=64, batch 4096, 20 ids per bag,
   rowwise adagrad, fp32): forward, fused backward+update (end to end: grouping + kernel;
   and the kernel alone), as achieved bandwidth against a measured device-to-device copy
   (``dst.copy_(src)`` of 1 GiB, read + write counted). Targets: forward >= 80% of copy
   bandwidth, fused backward+update >= 50%. ``--dims``: the same at other D; ``--sweep``: every
   launch configuration of both kernels.
3. ``--profile``: ``TableBatchedEmbedding``'s forward and forward+backward at batch 4096 and
   32768, validation on and off, timed and split by torch.profiler (the kernels against the
   rest), and the grouping's torch ops timed one by one.

The timings (2) and the profile (3), with the PTX check of the timed kernels, are in
tools/gpu_timing_triton.py.

Exit status 1 when a correctness check fails (timings only report).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from neo.config.embedding import OptimizerConfig, TableConfig, WeightDType  # noqa: E402
from neo.embedding import TableBatchedEmbedding  # noqa: E402

# this script's folder (tools/) is on sys.path, as for bench_embedding below
from gpu_timing_triton import profile_module, time_default  # noqa: E402

OPTS = ["sgd", "adagrad", "rowwise_adagrad", "adam", "lamb"]
ELEMENTWISE = {"sgd", "adagrad", "adam"}


# ------------------------------------------------------------------------------ helpers
def _ordered_bits(x: torch.Tensor) -> torch.Tensor:
    b = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return torch.where(b >= 0x8000, 0x8000 - b, b)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (_ordered_bits(a) - _ordered_bits(b)).abs()


def _cancellation(wf: torch.Tensor, wr: torch.Tensor, before: torch.Tensor, sr: bool):
    """(all explained, note) for 16-bit weights of a row-reducing optimizer that differ by more
    than 1 ulp: each such element must be within 1 ulp of the result (2 with stochastic
    rounding, which picks either neighbour of the fp32 value: two fp32 values a hair apart on
    either side of a 16-bit value can round to its two neighbours) plus 2^-20 (16 fp32 ulps) of
    the update's terms (|w before| + |update|). The row's fp32 step size is a reduction, and its
    order on the GPU cannot match torch's on the CPU; where w - step * g nearly cancels, a
    difference of a few fp32 ulps in it is several ulps of the small 16-bit result."""
    far = _ulps(wf, wr) > 1
    a, b, w0 = wf.float()[far], wr.float()[far], before[far]
    spacing = (torch.nextafter(wr[far], torch.full_like(wr[far], float("inf"))).float() - b).abs()
    bound = (2 if sr else 1) * spacing + 2.0 ** -20 * (w0.abs() + (w0 - b).abs())
    diff = (a - b).abs()
    i = int(torch.argmax(diff / bound))
    note = (f"; {int(far.sum())} element(s) > 1 ulp, {int((diff > bound).sum())} past the cancellation bound "
            f"(worst: before {float(w0[i]):.6g}, reference {float(b[i]):.6g}, triton {float(a[i]):.6g}, "
            f"bound {float(bound[i]):.3g})")
    return bool((diff <= bound).all()), note


# ---------------------------------------------------------------------------- correctness
def realistic_tables(opt: str, dtype: str, sr: bool):
    o = OptimizerConfig(opt, lr=0.02, weight_decay=0.01 if opt in ("adam", "lamb") else 0.0,
                        initial_accumulator_value=0.1 if "adagrad" in opt else 0.0)
    c = dict(optimizer=o, dtype=dtype, stochastic_rounding=sr)
    return [
        TableConfig("t4", num_rows=50_000, dim=4, **c),
        TableConfig("t12", num_rows=20_000, dim=12, feature_names=("t12a", "t12b"), pooling="mean", **c),
        TableConfig("t64", num_rows=100_000, dim=64, **c),
        TableConfig("t128", num_rows=30_000, dim=128, pooling="mean", **c),
        TableConfig("t256", num_rows=10_000, dim=256, **c),
    ]


def check_against_reference(opt: str, dtype: str, sr: bool, steps: int = 3, batch_size: int = 512,
                            device: str = "cuda", tables=None, long_bag: int = 300) -> bool:
    from tests.embedding.harness import clone_weights, random_batch

    tables = tables or realistic_tables(opt, dtype, sr)
    ref = TableBatchedEmbedding(tables, backend="reference", seed=11)
    fast = TableBatchedEmbedding(tables, backend="triton", seed=11, device=device)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(12)
    ok, worst = True, ""
    allowed = 0 if opt in ELEMENTWISE else 1
    for step in range(steps):
        batch = random_batch(tables, batch_size, gen, max_len=30, long_bag=long_bag, weighted=step % 2 == 1)
        before = {t.name: ref.table_weight(t.name).float().clone() for t in tables}
        out_ref = ref(batch)
        out_fast = fast(batch.to(device))
        try:
            torch.testing.assert_close(out_fast.cpu(), out_ref, rtol=1e-5, atol=1e-5)
        except AssertionError as e:
            ok, worst = False, f"forward step {step}: {str(e).splitlines()[1:3]}"
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad.to(device))
        for t in tables:
            wr, wf = ref.table_weight(t.name), fast.table_weight(t.name).cpu()
            if t.dtype is WeightDType.FP32:
                try:
                    torch.testing.assert_close(wf, wr, rtol=1e-5, atol=1e-6)
                except AssertionError as e:
                    ok, worst = False, f"{t.name} weights step {step}: {str(e).splitlines()[1:3]}"
            else:
                u = _ulps(wf, wr)
                if int(u.max()) > allowed:
                    explained = _cancellation(wf, wr, before[t.name], sr) if allowed else None
                    if explained is None or not explained[0]:
                        ok, worst = False, (f"{t.name} step {step}: max {int(u.max())} ulp, {int((u > 0).sum())} "
                                            f"elements differ{explained[1] if explained else ''}")
                    else:
                        print(f"    {t.name} step {step}: {explained[1]}")
            for k, v in ref.table_optimizer_state(t.name).items():
                vf = fast.table_optimizer_state(t.name)[k].cpu()
                exact = t.dtype is not WeightDType.FP32 and allowed == 0
                if exact and not torch.equal(vf, v):
                    ok, worst = False, f"{t.name} state {k} step {step} not bit-exact"
                elif not exact:
                    try:
                        torch.testing.assert_close(vf, v, rtol=1e-5, atol=1e-7)
                    except AssertionError as e:
                        ok, worst = False, f"{t.name} state {k} step {step}: {str(e).splitlines()[1:3]}"
        clone_weights(ref, fast)                                 # re-synchronise (see tests)
        for t in tables:
            for k, v in ref.table_optimizer_state(t.name).items():
                fast.table_optimizer_state(t.name)[k].copy_(v)
    print(f"  {opt:16s} {dtype:5s} sr={int(sr)}  {'ok' if ok else 'FAIL: ' + worst}")
    return ok


def check_int64_offsets() -> bool:
    """A table of > 2^31 weight elements (fp16): rows near its end, forward and an SGD update."""
    rows, dim = 8_400_000, 256                                  # 2.15e9 elements, 4.3 GB in fp16
    small = TableConfig("small", num_rows=1000, dim=64, dtype="fp16", stochastic_rounding=False,
                        optimizer=OptimizerConfig("sgd", lr=0.5))
    big = TableConfig("big", num_rows=rows, dim=dim, dtype="fp16", stochastic_rounding=False,
                      optimizer=OptimizerConfig("sgd", lr=0.5))
    m = TableBatchedEmbedding([small, big], backend="triton", device="cuda")
    from neo.sparse import KeyedJaggedBatch
    ids = [rows - 1, rows - 2, rows // 2, 0]
    batch = KeyedJaggedBatch.from_lists({"small": [[1], [999]], "big": [[ids[0], ids[1]], [ids[2], ids[3]]]}).to("cuda")
    w = m.table_weight("big")
    before = w[ids].float().clone()
    out = m(batch)
    expect = torch.stack([before[0] + before[1], before[2] + before[3]])
    ok = torch.allclose(out[:, 64:], expect, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(out)
    out.backward(grad)
    g_bag = grad[:, 64:]
    g = torch.stack([g_bag[0], g_bag[0], g_bag[1], g_bag[1]])
    expect_w = (before - 0.5 * g).half()
    ok = ok and torch.equal(w[ids], expect_w)
    print(f"  int64 offsets (2^31+ elements): {'ok' if ok else 'FAIL'}")
    del m, w
    torch.cuda.empty_cache()
    return ok


# ---------------------------------------------------------------------------- compile only
def compile_only() -> int:
    """Compile every kernel variant for sm_90 without a GPU (ptxas ships with triton), at the
    launch configurations the backend's rules choose (``forward_launch``, ``update_launch``),
    and check the PTX: no FMA contraction and no approximate division or square root in the
    fused update (bit-exactness with the reference), none in the forward either, vector row
    loads in the forward (16 bytes for fp32 rows, 8 for 16-bit ones). Returns the number of
    failures (a variant that does not compile is one)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from neo.embedding.backends import triton_kernels as k
    from neo.embedding.backends.triton import forward_launch, update_launch

    target = GPUTarget("cuda", 90, 32)
    failures = 0

    def comp(fn, sig, consts, opts):
        attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(sig.values()) if ty.startswith("*")}
        return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=target, options=opts)

    def mem_ops(ptx):
        return sorted(set(re.findall(r"(?:ld|st)\.global[\w\.]*", ptx)))

    def report(what: str, fn, sig, consts, opts, checks) -> None:
        nonlocal failures
        try:
            ptx = comp(fn, sig, consts, opts).asm["ptx"]
        except Exception as e:  # noqa: BLE001 - a compiler failure is the finding
            failures += 1
            print(f"{what}: FAIL, does not compile ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            return
        bad = [name for name, ok in checks(ptx) if not ok]
        failures += bool(bad)
        print(f"{what}: {'FAIL ' + ', '.join(bad) if bad else 'ok'}  {mem_ops(ptx)}")

    exact = lambda ptx: [("no fma", "fma.rn.f32" not in ptx),  # noqa: E731
                         ("no approximate div/sqrt", not any(x in ptx for x in ("div.full.f32", "sqrt.approx", "div.approx")))]
    wt = {0: "*fp32", 1: "*fp16", 2: "*i16"}
    fwd_sig = lambda wk: dict(  # noqa: E731
        weights_ptr=wt[wk], indices_ptr="*i64", offsets_ptr="*i64", psw_ptr="*fp32", out_ptr="*fp32",
        feature_table_ptr="*i64", table_rows_ptr="*i64", table_dims_ptr="*i64", weight_offsets_ptr="*i64",
        output_offsets_ptr="*i64", feature_mean_ptr="*i64", invalid_ptr="*i32", B="i32", total_dim="i32",
        HAS_PSW="constexpr", WKIND="constexpr", BLOCK_L="constexpr", BLOCK_D="constexpr", COUNT="constexpr")
    upd_sig = lambda wk: dict(  # noqa: E731
        weights_ptr=wt[wk], state0_ptr="*fp32", state1_ptr="*fp32", grad_ptr="*fp32",
        seg_start_ptr="*i64", num_segs_ptr="*i64", key_ptr="*i32", bag_ptr="*i32", psw_ptr="*fp32",
        offsets_ptr="*i64", feature_table_ptr="*i64", table_dims_ptr="*i64",
        weight_offsets_ptr="*i64", row_offsets_ptr="*i64", output_offsets_ptr="*i64",
        feature_mean_ptr="*i64", B="i32", total_dim="i32", total_rows="i32",
        lr="fp32", eps="fp32", weight_decay="fp32", beta1="fp32", one_minus_beta1="fp32",
        beta2="fp32", one_minus_beta2="fp32", bias_corr1="fp32", bias_corr2="fp32", sr_key="i64",
        OPT="constexpr", WKIND="constexpr", SR="constexpr", HAS_PSW="constexpr",
        HAS_WD="constexpr", BLOCK_S="constexpr", BLOCK_D="constexpr")
    for block_d in (16, 64, 128, 256, 512):
        bl, nw = forward_launch(block_d, 8)
        for wk in (0, 1, 2):
            vec = "ld.global.v4" if wk == 0 else "ld.global.v2"
            for count in ((False, True) if block_d == 64 else (False,)):   # counting invalid ids: at D 64
                report(f"forward  D {block_d:3d} wkind={wk} count={int(count)} ({bl} ids x {nw} warps)",
                       k.pooled_forward_kernel, fwd_sig(wk),
                       dict(HAS_PSW=True, WKIND=wk, BLOCK_L=bl, BLOCK_D=block_d, COUNT=count),
                       dict(num_warps=nw, enable_fp_fusion=False),
                       lambda ptx, vec=vec, count=count: exact(ptx) + [(f"vector row loads ({vec})", vec in ptx)]
                       + ([("an atomic add of the count", "atom.global" in ptx or "red.global" in ptx)] if count else []))
    sig = dict(indices_ptr="*i64", offsets_ptr="*i64", key_ptr="*i32", bag_ptr="*i32", feature_table_ptr="*i64",
               table_rows_ptr="*i64", row_offsets_ptr="*i64", B="i32", total_rows="i32", BLOCK_L="constexpr")
    report("row_keys", k.row_keys_kernel, sig, dict(BLOCK_L=32), dict(num_warps=1), lambda ptx: [])
    for block_d in (16, 64, 128, 256, 512):
        bs, nw = update_launch(block_d)
        for opt in range(5):
            for wk in (0, 1, 2):
                for sr in ((False, True) if wk else (False,)):
                    if block_d != 64 and (opt != 2 or sr):     # every variant at D 64; row-wise Adagrad elsewhere
                        continue
                    report(f"update   D {block_d:3d} opt={opt} wkind={wk} sr={int(sr)} ({bs} rows x {nw} warps)",
                           k.fused_backward_update_kernel, upd_sig(wk),
                           dict(OPT=opt, WKIND=wk, SR=sr, HAS_PSW=True, HAS_WD=True, BLOCK_S=bs, BLOCK_D=block_d),
                           dict(num_warps=nw, enable_fp_fusion=False), exact)
    print(f"compile-only (Triton {triton.__version__}, sm_90): "
          f"{'every variant compiled and passed' if not failures else f'{failures} FAILED'}")
    return failures


# ------------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-big", action="store_true", help="skip the > 2^31-element table check (4.3 GB)")
    ap.add_argument("--sweep", action="store_true", help="sweep launch configurations of both kernels")
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90 without a GPU")
    ap.add_argument("--dims", default="64", help="comma-separated D of the timed workload (default 64)")
    ap.add_argument("--profile", action="store_true",
                    help="the module's forward and forward+backward on the default workload: time split "
                         "between the kernels and the rest (torch.profiler), validate on and off")
    args = ap.parse_args()
    if args.compile_only:
        return 1 if compile_only() else 0
    if not torch.cuda.is_available():
        print("no CUDA device: run with --compile-only, or on an H100/H200")
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {__import__('triton').__version__}")
    ok = True
    if not args.skip_correctness:
        t0 = time.time()
        print("correctness against the reference (CPU), realistic shapes:")
        for dtype, sr in [("fp32", False), ("fp16", False), ("fp16", True), ("bf16", False), ("bf16", True)]:
            for opt in OPTS:
                ok &= check_against_reference(opt, dtype, sr)
        if not args.skip_big:
            ok &= check_int64_offsets()
        print(f"correctness: {'ALL OK' if ok else 'FAILURES'} ({time.time() - t0:.0f} s)")
    if not args.skip_timing:
        from bench_embedding import copy_bandwidth          # the same yardstick as the benchmark's

        bw = copy_bandwidth("cuda")
        for dim in (int(x) for x in args.dims.split(",")):
            time_default(bw, args.sweep, dim)
    if args.profile:
        profile_module()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
