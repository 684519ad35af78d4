"""Build and install Neo.

    pip install --no-build-isolation -e .     # after `pip install -r requirements.txt`

``--no-build-isolation`` builds against the torch already installed (an isolated build
environment would download a different torch). The C++ extension ``neo._C`` is built from
``csrc/*.cpp`` with OpenMP; ``csrc/cuda/*.cu`` are added only where torch has CUDA and
nvcc is found. Set ``NEO_NATIVE=0`` to build without ``-march=native`` (portable binary).
"""

import glob
import os

from setuptools import find_packages, setup

from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
import torch

here = os.path.dirname(os.path.abspath(__file__))
cpp_sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
cuda_sources = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
with_cuda = bool(cuda_sources) and torch.version.cuda is not None and CUDA_HOME is not None

# -fno-math-errno: sqrt never sets errno, so it compiles to the (correctly rounded) vector
# instruction instead of a libm call per element.
cxx_flags = ["-O3", "-fopenmp", "-std=c++17", "-fno-math-errno"]
if os.environ.get("NEO_NATIVE", "1") != "0":
    cxx_flags.append("-march=native")
ext_kwargs = dict(
    name="neo._C",
    sources=cpp_sources + (cuda_sources if with_cuda else []),
    extra_compile_args={"cxx": cxx_flags + (["-DNEO_WITH_CUDA"] if with_cuda else []), "nvcc": ["-O3"]},
    extra_link_args=["-fopenmp"],
)
ext = CUDAExtension(**ext_kwargs) if with_cuda else CppExtension(**ext_kwargs)

setup(
    name="neo-dlrm",
    version="0.1.0",
    description="Training deep-learning recommendation models with embedding tables larger than one device",
    packages=find_packages(include=["neo", "neo.*", "data_pipeline", "data_pipeline.*"]),
    python_requires=">=3.10",
    # torch is pinned in requirements.txt (2.13.0 on CPU machines); a range here keeps
    # `pip install` from replacing an installed torch with a download.
    install_requires=["torch>=2.4", "numpy", "pyarrow", "omegaconf", "pyyaml", "tqdm"],
    extras_require={"peers": ["fbgemm-gpu-cpu==1.8.0"], "test": ["pytest"]},
    ext_modules=[ext] if cpp_sources else [],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
    entry_points={"console_scripts": ["neo = neo.cli:main", "neo-data = data_pipeline.cli:main"]},
)
