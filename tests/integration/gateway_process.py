"""`horizonrl gateway MODEL` in a subprocess, for tests that talk to it over HTTP."""

import contextlib
import socket
import subprocess
import sys
import time

import httpx


@contextlib.contextmanager
def gateway_process(model: str, *options: str, start_timeout_s: float = 120):
    """Start the gateway on a free local port and wait for /health; yields (base URL, process) and
    terminates it after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "horizonrl.cli", "gateway", model, "--port", str(port),
                                "--device", "cpu", *options], stdout=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.ConnectError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.5)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)
