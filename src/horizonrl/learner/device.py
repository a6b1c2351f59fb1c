"""Where the networks run: CPU in fp32, or a CUDA GPU with bf16 autocast over fp32 weights."""

from __future__ import annotations

import contextlib

import torch


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present, else CPU; 'cuda' without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but no CUDA GPU is available; use device=auto or device=cpu")
    return device


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 on CUDA, full precision elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else None


def autocast(device: torch.device):
    dtype = autocast_dtype(device)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
