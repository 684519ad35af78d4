"""Build and install Neo.

    pip install --no-build-isolation -e .     # after `pip install -r requirements.txt`

``--no-build-isolation`` builds against the torch already installed (an isolated build
environment would download a different torch). The C++ extension ``neo._C`` is built from
``csrc/*.cpp`` with OpenMP; CUDA sources, if a ``csrc/cuda/`` folder holds any (none today:
the GPU kernels are Triton's), are added only where torch has CUDA and nvcc is found.

The build is portable: the hot kernels (``csrc/kernels/``) are compiled once per ISA
variant, by the wrappers in ``csrc/isa/``, each with its own flags (below), and
``neo._C`` picks the best variant the CPU supports at import (``csrc/cpu_isa.h``;
``NEO_CPU_ISA=baseline|avx2|avx512`` overrides). Everything else is compiled for the
baseline ISA, so one build runs on any x86-64 (or aarch64: the baseline variant only) and
is fast on each. ``NEO_NATIVE=1`` adds ``-march=native`` to the baseline code (faster
baseline on this machine, but the library then needs this machine's ISA).
"""

import glob
import os
import platform
from concurrent.futures import ThreadPoolExecutor

from setuptools import find_packages, setup

from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
import torch

here = os.path.dirname(os.path.abspath(__file__))
X86 = platform.machine().lower() in ("x86_64", "amd64")
NATIVE = os.environ.get("NEO_NATIVE", "0") == "1"

# Per-variant flags, by wrapper file (csrc/isa/kernels_<isa>.cpp). AVX2 needs FMA and F16C
# (every AVX2 CPU has them); AVX-512 is the Skylake-SP subset (F, BW, VL, DQ).
AVX2_FLAGS = ["-mavx2", "-mfma", "-mf16c"]
ISA_FLAGS = {
    "baseline": ["-march=native"] if NATIVE else [],
    "avx2": AVX2_FLAGS + (["-mno-avx512f"] if NATIVE else []),
    "avx512": AVX2_FLAGS + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mprefer-vector-width=512"],
}
VARIANTS = ["baseline", "avx2", "avx512"] if X86 else ["baseline"]

cpp_sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
variant_sources = [os.path.join("csrc", "isa", f"kernels_{v}.cpp") for v in VARIANTS]
cuda_sources = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
headers = sorted(glob.glob(os.path.join("csrc", "**", "*.h"), recursive=True))
with_cuda = bool(cuda_sources) and torch.version.cuda is not None and CUDA_HOME is not None

# -fno-math-errno: sqrt never sets errno, so it compiles to the (correctly rounded) vector
# instruction instead of a libm call per element.
# -ffp-contract=off: no implicit FMA. The embedding kernels round every product and sum
# separately, as the reference does (bit-identical outputs); the dot interaction writes its
# fused multiply-adds explicitly.
# -fno-wrapv: undoes the -fwrapv of Python's own CFLAGS (sysconfig), which setuptools puts
# first: with signed overflow defined to wrap, GCC keeps the kernels' int64 index arithmetic
# literally (bound checks like `i + near < end` each iteration). The forward lookup's loop ran
# 1-3% slower with it (docs/benchmarks.md); no kernel relies on wrapping.
cxx_flags = ["-O3", "-fopenmp", "-std=c++17", "-fno-math-errno", "-ffp-contract=off", "-fno-wrapv"]
cxx_flags += [f"-DNEO_HAVE_{v.upper()}" for v in VARIANTS if v != "baseline"]
if NATIVE:
    cxx_flags += ["-DNEO_NATIVE_BUILD", "-march=native"]


def variant_flags(src: str) -> list:
    """Extra flags of a variant wrapper (csrc/isa/kernels_<isa>.cpp); none for other sources.
    -fno-tree-loop-distribute-patterns keeps short per-row loops (zeroing, copies) inline
    rather than calls to memset/memcpy, which cost more than the loops at D = 64."""
    name = os.path.basename(src)
    for v, flags in ISA_FLAGS.items():
        if name == f"kernels_{v}.cpp":
            return ["-fno-tree-loop-distribute-patterns"] + flags
    return []


class NeoBuildExt(BuildExtension.with_options(use_ninja=False)):
    """torch's BuildExtension, compiling each ISA variant's wrapper with its own flags
    (setuptools gives every source of an extension the same flags)."""

    def build_extension(self, ext):
        compile_one = self.compiler._compile

        def compile_with_variant_flags(obj, src, ext_, cc_args, extra_postargs, pp_opts):
            extra = variant_flags(src)
            if extra:
                if isinstance(extra_postargs, dict):
                    extra_postargs = dict(extra_postargs, cxx=list(extra_postargs.get("cxx", [])) + extra)
                else:
                    extra_postargs = list(extra_postargs) + extra
            return compile_one(obj, src, ext_, cc_args, extra_postargs, pp_opts)

        link_one = self.compiler.link

        def link_in_order(target_desc, objects, *args, **kwargs):
            return link_one(target_desc, link_order(objects), *args, **kwargs)

        compile_all = self.compiler.compile

        def compile_in_parallel(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                                extra_preargs=None, extra_postargs=None, depends=None):
            """setuptools' CCompiler.compile, one source per core (it compiles one at a time;
            torch's ninja path would, but it bypasses the per-variant flags above)."""
            macros, objects, extra_postargs, pp_opts, build = self.compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = self.compiler._get_cc_args(pp_opts, debug, extra_preargs)

            def one(obj):
                src, ext_ = build[obj]
                self.compiler._compile(obj, src, ext_, cc_args, extra_postargs, pp_opts)

            with ThreadPoolExecutor(max_workers=build_jobs()) as pool:
                list(pool.map(one, [obj for obj in objects if obj in build]))
            return objects

        self.compiler._compile, self.compiler.link = compile_with_variant_flags, link_in_order
        self.compiler.compile = compile_in_parallel
        try:
            super().build_extension(ext)
        finally:
            self.compiler._compile, self.compiler.link = compile_one, link_one
            self.compiler.compile = compile_all


def build_jobs() -> int:
    """Compiler processes at once: MAX_JOBS (torch's variable) or the usable cores."""
    if os.environ.get("MAX_JOBS"):
        return max(1, int(os.environ["MAX_JOBS"]))
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def link_order(objects: list) -> list:
    """The entry points' objects first, then the variants', baseline first. Where a variant
    emits an inline function of a shared header (std::, c10::) out of line, the linker keeps
    the first copy it sees: the baseline's. (setuptools sorts the sources by name.)"""
    def key(obj):
        name = os.path.basename(obj)
        for i, v in enumerate(VARIANTS):
            if name.startswith(f"kernels_{v}."):
                return (1, i)
        return (0, 0)
    return sorted(objects, key=key)   # stable: the entry points keep their order


ext_kwargs = dict(
    name="neo._C",
    sources=cpp_sources + variant_sources + (cuda_sources if with_cuda else []),
    depends=headers,
    extra_compile_args={"cxx": cxx_flags + (["-DNEO_WITH_CUDA"] if with_cuda else []), "nvcc": ["-O3"]},
    # The torch libraries' folder in the extension's run path: `import neo._C` then loads without
    # torch imported first (the module imports torch as it starts, bindings.cpp).
    extra_link_args=["-fopenmp", f"-Wl,-rpath,{os.path.join(os.path.dirname(torch.__file__), 'lib')}"],
)
ext = CUDAExtension(**ext_kwargs) if with_cuda else CppExtension(**ext_kwargs)

setup(
    name="neo-dlrm",
    version="0.1.0",
    description="Training deep-learning recommendation models with embedding tables larger than one device",
    packages=find_packages(include=["neo", "neo.*", "data_pipeline", "data_pipeline.*"]),
    # The reference data (real Criteo rows, production access statistics) travels with the package.
    package_data={"data_pipeline.samples": ["*.tsv", "*.txt", "README.md"]},
    python_requires=">=3.10",
    # torch is pinned in requirements.txt (2.13.0 on CPU machines); a range here keeps
    # `pip install` from replacing an installed torch with a download.
    install_requires=["torch>=2.4", "numpy", "pyarrow", "omegaconf", "pyyaml", "tqdm"],
    extras_require={"peers": ["fbgemm-gpu-cpu==1.8.0"], "test": ["pytest"]},
    ext_modules=[ext] if cpp_sources else [],
    cmdclass={"build_ext": NeoBuildExt},
    entry_points={"console_scripts": ["neo = neo.cli:main", "neo-data = data_pipeline.cli:main"]},
)
