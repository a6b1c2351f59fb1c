"""Launch a command on N ranks with torchrun (gloo, on the CPU) for the distributed tests.

FSDP2 on gloo has aborted transiently on this kind of machine (torch 2.13; once in CI: a rank killed by
SIGABRT from a thread with no Python frame, after its work was written, and no rank raised): a launch
that fails that way (`transient_abort`) is retried once, and every retry is reported on stderr and
appended to `RETRY_LOG`, so that how often it happens stays visible. Any other failure is the test's
answer: an exception on a rank, or an abort of gloo's own finding, a collective mismatch between the
ranks (what a rank-dependent bug gives), is never retried. A retry starts where the failed launch
started: the run folders the failed launch created under `output_dir` are removed first."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

RETRY_LOG = Path(__file__).resolve().parents[2] / "runs" / "torchrun_retries.log"
FAILURE_MARKERS = ("terminate called", "Fatal Python error", "Traceback (most recent call last)")
ROOT_CAUSE = "Root Cause (first observed failure):"   # torchrun's summary of the rank that failed first
COLLECTIVE_MISMATCH = "collective mismatch"           # gloo: the ranks called different collectives
EXCEPTION_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:\w+\.)*\w*(?:Error|Exception)\b.*$", re.M)
PEER_LOST = re.compile(r"gloo/transport/tcp/pair\.cc:\d+\].*Connection (?:reset|closed) by peer")


def torchrun(nproc: int, args: list[str], timeout_s: float = 600, retries: int = 1, cwd: Path | None = None,
             expect_failure: bool = False) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node nproc --standalone ARGS`; its completed process.
    A launch that fails by a `transient_abort` is retried `retries` times (not when a failure is what the
    test expects); any other failure is returned at once."""
    output_dir = next((Path(arg.split("=", 1)[1]) for arg in args if arg.startswith("output_dir=")), None)
    existing = folders_in(output_dir)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for attempt in range(retries + 1):
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
        if done.returncode == 0 or expect_failure or attempt == retries or not transient_abort(done.stderr):
            return done
        RETRY_LOG.parent.mkdir(parents=True, exist_ok=True)
        with RETRY_LOG.open("a") as log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} retry after exit {done.returncode} "
                      f"({time.monotonic() - started:.0f} s): {' '.join(args)}\n")
        print(f"torchrun failed (exit {done.returncode}), retrying once:\n{failure_excerpt(done.stderr)}",
              file=sys.stderr)
        for created in folders_in(output_dir) - existing:
            shutil.rmtree(created)
    return done


def folders_in(output_dir: Path | None) -> set[Path]:
    """What `output_dir` holds (nothing when there is none, or none yet)."""
    return set(output_dir.iterdir()) if output_dir is not None and output_dir.is_dir() else set()


def failure_excerpt(stderr: str, size: int = 3000) -> str:
    """`size` characters of a failed launch's stderr from where a rank first reported its failure (a C++
    terminate, a fatal Python error, a traceback), else its last `size` characters; torchrun's own summary
    at the end names the failed rank but not why it failed."""
    starts = [start for start in (stderr.find(marker) for marker in FAILURE_MARKERS) if start >= 0]
    start = min(starts, default=max(0, len(stderr) - size))
    return stderr[start:start + size]


def transient_abort(stderr: str) -> bool:
    """Whether a failed launch's stderr is the known transient gloo abort: the rank that failed first was
    killed by SIGABRT, gloo found no collective mismatch, and the only Python exceptions any rank raised
    are the lost connections to the aborted rank. (torchrun's own ChildFailedError, which every failed
    launch ends with, is not a rank's.)"""
    if "(SIGABRT)" not in stderr.rpartition(ROOT_CAUSE)[2] or COLLECTIVE_MISMATCH in stderr:
        return False
    raised = [line for line in EXCEPTION_LINE.findall(stderr) if "ChildFailedError" not in line]
    return all(PEER_LOST.search(line) for line in raised)
