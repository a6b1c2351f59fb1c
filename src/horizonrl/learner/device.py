"""Where the networks run and in which precision: fp32 weights always (the optimizer's master copy),
with bf16 autocast where it pays.

`precision` (a run's, eval's or the gateway's setting; one per process, as the device is):
- `fp32`: no autocast;
- `bf16`: bf16 autocast on any device;
- `auto`: bf16 autocast on CUDA and on CPUs with AMX-BF16 tiles; fp32 elsewhere. Measured on a
  2-core CPU with avx512_bf16 but no AMX (SmolLM2-135M, forward+backward of 4 x 256 tokens, one thread):
  fp32 86 tok/s, bf16 autocast 64 tok/s, so avx512_bf16 alone does not make bf16 pay
  (`python benchmarks/precision.py`, BENCHMARKS.md "Precision"). No CPU with AMX has been measured by this
  repository; `benchmarks/precision.py` is the command that would. `HORIZONRL_CPU_BF16=0|1` overrides the
  detection (the tests pin it to 0, so that `auto` means fp32 on every CI machine).
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import torch


PRECISIONS = ("auto", "fp32", "bf16")
_precision = "auto"


@contextlib.contextmanager
def precision(name: str):
    """Compute in `name` (auto | fp32 | bf16) inside this block: every autocast of the learner and
    the hf engine follows it."""
    global _precision
    if name not in PRECISIONS:
        raise ValueError(f"precision: {name!r} is not one of {', '.join(PRECISIONS)}")
    before, _precision = _precision, name
    try:
        yield
    finally:
        _precision = before


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present, else CPU; 'cuda' without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but no CUDA GPU is available; use device=auto or device=cpu")
    return device


def cpu_has_amx_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in AMX tiles; HORIZONRL_CPU_BF16=0|1 overrides."""
    forced = os.environ.get("HORIZONRL_CPU_BF16")
    return forced == "1" if forced is not None else cpuinfo_has_amx_bf16()


@functools.cache
def cpuinfo_has_amx_bf16() -> bool:
    """The amx_bf16 flag of /proc/cpuinfo (Linux), read once per process: autocast_dtype runs on every
    forward pass."""
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.is_file() and "amx_bf16" in cpuinfo.read_text().split()


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 where the current `precision` asks for it on `device`, else None (full precision)."""
    if _precision == "fp32":
        return None
    if _precision == "bf16" or device.type == "cuda" or (device.type == "cpu" and cpu_has_amx_bf16()):
        return torch.bfloat16
    return None


def autocast(device: torch.device):
    dtype = autocast_dtype(device)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
