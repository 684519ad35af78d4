"""Embedding backends behind one interface (see :mod:`neo.embedding.backends.base`).

- ``reference``: plain PyTorch, the oracle;
- ``cpu``: C++ kernels from ``csrc/`` (``neo._C``), multithreaded;
- ``triton``: Triton kernels for CUDA (and, under ``TRITON_INTERPRET=1``, CPU tensors);
- ``fbgemm``: FBGEMM's table-batched embedding, where ``fbgemm_gpu`` is importable.
"""

from __future__ import annotations

import importlib

import torch

from neo.cpp import cpu_kernels
from neo.embedding.backends.base import EmbeddingBackend

_BACKENDS = {
    "reference": ("neo.embedding.backends.reference", "ReferenceBackend"),
    "cpu": ("neo.embedding.backends.cpu", "CpuBackend"),
    "triton": ("neo.embedding.backends.triton", "TritonBackend"),
    "fbgemm": ("neo.embedding.backends.fbgemm", "FbgemmBackend"),
}

BACKEND_NAMES = tuple(_BACKENDS) + ("auto",)


def cpu_backend_available() -> bool:
    return cpu_kernels("embedding_forward") is not None


def resolve_backend_name(name: str, device: torch.device) -> str:
    if name != "auto":
        if name not in _BACKENDS:
            raise ValueError(f"unknown embedding backend {name!r}; choose one of {list(BACKEND_NAMES)}")
        return name
    if device.type == "cuda":
        return "triton"
    return "cpu" if cpu_backend_available() else "reference"


def get_backend(name: str) -> EmbeddingBackend:
    module_name, cls_name = _BACKENDS[name]
    return getattr(importlib.import_module(module_name), cls_name)()
