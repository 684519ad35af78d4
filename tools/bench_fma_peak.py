"""One core's fp32 multiply-add peak: the ceiling for the fused dot interaction's arithmetic.

    python tools/bench_fma_peak.py                       # AVX2 (and AVX-512 where the CPU has it)
    python tools/bench_fma_peak.py --json bench_out/fma_peak.json

A C loop of 12 independent chains of ``fma(acc, x, y)`` on 8-float (AVX2) or 16-float
(AVX-512) vectors, each chain a named variable kept in a register (an asm barrier per
iteration: no spills, nothing folded away), compiled here with the system's C compiler
(``cc``, as ``setup.py`` needs one anyway) and run pinned to one thread. 12 chains cover the
FMA latency (4 cycles) times the FMA pipes (2) with room to spare. Reported: GFLOP/s (2 flops a
lane) per ISA, the best of ``--reps``; docs/benchmarks.md sets the interaction's time against it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_common import json_path, positive_int  # noqa: E402
from bench_common import describe_machine, machine_info, write_json  # noqa: E402

CHAINS = 12

_SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define CHAIN(r) r = FMA(r, x, y);
int main(int argc, char** argv) {
  const long n = atol(argv[1]);
  VEC x = SET1(1.0000001f), y = SET1(0.9999999f);
  VEC a0 = SET1(0), a1 = SET1(1), a2 = SET1(2), a3 = SET1(3), a4 = SET1(4), a5 = SET1(5);
  VEC a6 = SET1(6), a7 = SET1(7), a8 = SET1(8), a9 = SET1(9), a10 = SET1(10), a11 = SET1(11);
  const double t0 = now();
  for (long k = 0; k < n; ++k) {
    CHAIN(a0) CHAIN(a1) CHAIN(a2) CHAIN(a3) CHAIN(a4) CHAIN(a5)
    CHAIN(a6) CHAIN(a7) CHAIN(a8) CHAIN(a9) CHAIN(a10) CHAIN(a11)
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5),
                          "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  const double t = now() - t0;
  float out[LANES];
  STORE(out, ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(ADD(a6, a7), ADD(ADD(a8, a9), ADD(a10, a11))))));
  printf("%.6f %g\n", t, out[0]);   /* the sum keeps every chain live */
  return 0;
}
"""

_ISAS = {
    "avx2": {"flag": "avx2", "lanes": 8, "cflags": ["-mavx2", "-mfma"],
             "defs": {"VEC": "__m256", "FMA": "_mm256_fmadd_ps", "SET1": "_mm256_set1_ps",
                      "ADD": "_mm256_add_ps", "STORE": "_mm256_storeu_ps"}},
    "avx512": {"flag": "avx512f", "lanes": 16, "cflags": ["-mavx512f"],
               "defs": {"VEC": "__m512", "FMA": "_mm512_fmadd_ps", "SET1": "_mm512_set1_ps",
                        "ADD": "_mm512_add_ps", "STORE": "_mm512_storeu_ps"}},
}


def measure(isa: str, iterations: int, reps: int, workdir: str) -> Dict:
    spec = _ISAS[isa]
    src, exe = os.path.join(workdir, f"fma_{isa}.c"), os.path.join(workdir, f"fma_{isa}")
    with open(src, "w") as f:
        f.write(_SOURCE)
    defs = [f"-D{k}={v}" for k, v in spec["defs"].items()] + [f"-DLANES={spec['lanes']}"]
    subprocess.run(["cc", "-O2", *spec["cflags"], *defs, src, "-o", exe], check=True)
    flops = iterations * CHAINS * spec["lanes"] * 2
    seconds = min(float(subprocess.run([exe, str(iterations)], check=True, capture_output=True, text=True)
                        .stdout.split()[0]) for _ in range(reps))
    return {"isa": isa, "chains": CHAINS, "lanes": spec["lanes"], "iterations": iterations, "seconds": seconds,
            "gflops": flops / seconds / 1e9, "fma_per_s": flops / 2 / seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=positive_int, default=30_000_000, help="loop trips (12 vector FMAs each)")
    p.add_argument("--reps", type=positive_int, default=5)
    p.add_argument("--json", metavar="FILE", type=json_path)
    args = p.parse_args(argv)
    machine = machine_info()
    print(describe_machine(machine))
    records: List[Dict] = []
    with tempfile.TemporaryDirectory(prefix="neo_fma_") as tmp:
        for isa, spec in _ISAS.items():
            if spec["flag"] not in machine["cpu_flags"]:
                print(f"{isa}: not on this CPU")
                continue
            r = measure(isa, args.iterations, args.reps, tmp)
            r["machine"] = machine
            records.append(r)
            print(f"{isa:7s} {r['gflops']:7.1f} GFLOP/s  ({r['fma_per_s'] / 1e9:.1f} G fp32 FMAs/s, "
                  f"best of {args.reps} runs of {r['seconds']:.3f} s)")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
