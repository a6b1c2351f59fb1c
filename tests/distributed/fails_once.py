"""A 2-rank gloo job that fails on its first launch only (the file MARKER records that it ran), in one
of three ways, and then succeeds:

    torchrun --nproc_per_node 2 fails_once.py raise|abort|mismatch MARKER

raise: rank 1 raises a Python exception (an intermittent bug); abort: rank 1 is killed by SIGABRT from
a thread with no Python frame (the transient gloo abort the launcher retries); mismatch: the ranks
all-reduce tensors of different sizes, which gloo aborts on (a rank-dependent bug)."""

import ctypes
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def abort_from_a_native_thread() -> None:
    libc = ctypes.CDLL(None)
    thread = ctypes.c_ulong()
    libc.pthread_create(ctypes.byref(thread), None, ctypes.cast(libc.abort, ctypes.c_void_p), None)
    time.sleep(30)


def main(mode: str, marker: Path) -> None:
    dist.init_process_group("gloo")
    rank, first = dist.get_rank(), not marker.exists()
    dist.barrier()
    if rank == 0 and first:
        marker.touch()
    if first and mode == "raise" and rank == 1:
        raise RuntimeError("an intermittent bug on rank 1")
    if first and mode == "abort" and rank == 1:
        abort_from_a_native_thread()
    if first and mode == "mismatch":
        dist.all_reduce(torch.zeros(10 + 2 * rank, dtype=torch.float64))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
