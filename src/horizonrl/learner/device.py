"""Where the networks run, in which precision and on how many CPU threads: fp32 weights always (the
optimizer's master copy), with bf16 autocast where it pays.

`precision` (a run's, eval's or the gateway's setting; one per process, as the device is):
- `fp32`: no autocast;
- `bf16`: bf16 autocast on any device;
- `auto`: bf16 autocast on CUDA and on CPUs with AMX-BF16 tiles; fp32 elsewhere. Measured on a
  2-core CPU with avx512_bf16 but no AMX (SmolLM2-135M, forward+backward of 4 x 256 tokens, one thread):
  fp32 86 tok/s, bf16 autocast 64 tok/s, so avx512_bf16 alone does not make bf16 pay
  (`python benchmarks/precision.py`, BENCHMARKS.md "Precision"). No CPU with AMX has been measured by this
  repository; `benchmarks/precision.py` is the command that would. `HORIZONRL_CPU_BF16=0|1` overrides the
  detection (the tests pin it to 0, so that `auto` means fp32 on every CI machine).

`threads` (a run's `threads` key, eval's and the gateway's --threads; HORIZONRL_THREADS=N overrides them all):
torch's CPU threads in this process, chosen once where the command starts (`use_threads`). torch's own count is
every physical core, and its OpenMP threads spin-wait for each other: once another process holds one of those
cores, each parallel region waits for the thread that lost its core. benchmarks/threads.py (SmolLM2-135M, hf
engine, 2-core CPU shared with other work): 2 threads decoded 0.3-1.3 tokens/s where 1 thread decoded 7-10.
So `auto` leaves one core to the rest of the machine (a second job, agents, env workers) and divides the others
among the run's processes that compute at once: the gateway and the agents that call it; the learner and the
producer that samples while it updates (K >= 1, thread or process); torchrun's ranks on this machine:
max(1, (cores - 1) // processes). On 2 cores every process gets 1; alone on 16, a run gets 15. On a GPU `auto`
leaves torch's count as it is; OMP_NUM_THREADS, when set, is torch's count (torchrun sets it to 1 for several
ranks). The count does not follow the machine's load (a run's numbers would change with it): on a machine
whose other work takes more than one core, set it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path

import torch

from horizonrl.config import ConfigError, TrainConfig, parse_threads

log = logging.getLogger(__name__)

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


THREADS_VARIABLE = "HORIZONRL_THREADS"
TORCH_THREADS = torch.get_num_threads()   # torch's own count, read before anything sets it: the physical cores


def usable_cores() -> int:
    """The cores this process may run on: torch's own count (physical cores), at most the CPUs of its affinity
    mask (a container or `taskset` given fewer)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else TORCH_THREADS
    return max(1, min(TORCH_THREADS, affinity))


def choose_threads(setting: int | str, device_type: str, sharers: int, cores: int,
                   omp_num_threads: str | None = None) -> tuple[int | None, str]:
    """torch's thread count for a process (None: leave torch's own) and why. `setting`: a count, or auto: on
    the CPU, `cores` but one divided among the `sharers` processes of the run that compute at once, at least 1;
    on a GPU, or with OMP_NUM_THREADS set (`omp_num_threads`), torch's own count."""
    if setting != "auto":
        return setting, f"threads={setting}"
    if device_type != "cpu":
        return None, f"auto on {device_type}: torch's own count"
    if omp_num_threads:
        return None, f"auto: OMP_NUM_THREADS={omp_num_threads}"
    return (max(1, (cores - 1) // sharers),
            f"auto: {cores} cores, one left to other work, the rest shared by {sharers} process{'es' * (sharers > 1)}")


def use_threads(setting: int | str, device_type: str, sharers: int = 1, who: str = "this process") -> int:
    """Set torch's thread count for this process as `choose_threads` decides (HORIZONRL_THREADS=N overrides
    `setting`) and log it once; returns it. `who`: the processes counted in `sharers`, for the log."""
    forced = os.environ.get(THREADS_VARIABLE)
    if forced:
        try:
            setting = parse_threads(forced)
        except ValueError as error:
            raise ConfigError(f"{THREADS_VARIABLE}: {error}") from None
    count, why = choose_threads(setting, device_type, sharers, usable_cores(), os.environ.get("OMP_NUM_THREADS"))
    if forced:
        why = f"{THREADS_VARIABLE}={forced}: {why}"
    if count is not None:
        torch.set_num_threads(count)
    log.info("torch threads: %d (%s%s; threads=N, --threads N or %s=N sets it)", torch.get_num_threads(), why,
             f", {who}" if count is not None and setting == "auto" else "", THREADS_VARIABLE)
    return torch.get_num_threads()


def use_run_threads(cfg: TrainConfig, command: str = "train") -> int:
    """`use_threads` for a train or sft run: its processes that compute at once on this machine are torchrun's
    ranks here (LOCAL_WORLD_SIZE), each with a producer that samples while the learner updates when
    rollout.async_training.max_staleness >= 1 (sft: none)."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    overlapped = command == "train" and cfg.rollout.async_training.max_staleness > 0
    who = (f"{ranks} rank{'s' if ranks > 1 else ''}" + (" x learner and producer" if overlapped else "")
           if ranks > 1 or overlapped else "one process")
    return use_threads(cfg.threads, resolve_device(cfg.device).type, ranks * (2 if overlapped else 1), who)
