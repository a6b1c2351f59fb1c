"""Built-in `python` tool: runs model-written code in a throw-away, resource-limited child process.

Each `run_python` call gets a fresh temporary working directory (deleted afterwards) and runs
`python -I -B -u` (isolated: no user site-packages, no PYTHON* variables, no .pyc writes) with a
minimal environment. Layers, outermost first:

- Kernel namespaces: where `unshare` can make a user namespace (checked once per process), the child
  runs in new user, network and PID namespaces: no network interface but a down loopback, no way to
  signal a process outside (the trainer included), and all its processes die with it.
- Resource limits, set by the child on itself before the user's code: address space (`memory_mb`),
  CPU seconds (`cpu_s`), file size (FILE_LIMIT_MB, which also bounds stdout and stderr, written to
  files), no core dumps, and no new processes or threads (RLIMIT_NPROC 0; the kernel does not
  enforce this one for root).
- An audit hook (`sys.addaudithook`), installed before the user's code, that raises PermissionError
  on: every `socket.*` event (creation, connect, DNS); every `ctypes.*` event but the dlopen(None)
  that `import ctypes` does (numpy still imports; loading a library, looking up a symbol or touching
  raw memory is refused); starting or signalling processes (`subprocess.Popen`, `os.system`,
  `os.exec`, `os.spawn`, `os.posix_spawn`, `os.fork`, `os.forkpty`, `os.kill`, `os.killpg`);
  `open` with write, append, create or truncate flags, and the path-changing `os.*` calls (remove,
  rename, mkdir, symlink, chmod, ...), on a path that resolves outside the working directory.
  Reading files stays allowed.
- In the parent: a wall-clock limit (`timeout_s`), after which the child's processes are killed;
  they are killed and reaped in every case, so nothing is left running (see `stop`).

Audit hooks stop what a model writes by mistake or naively, not a determined attacker (PEP 578: they
are not a sandbox); against adversarial code only the kernel layers hold, and file writes are
guarded by the audit hook alone. Run the trainer in a container when that matters.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from horizonrl.tools.registry import tool

FILE_LIMIT_MB = 16
MAX_OUTPUT_CHARS = 10_000
STOP_GRACE_S = 1.0     # how long a stopped namespace may take to wind down before its group is killed
# PID 1 of a namespace ignores the signals it has no handler for (SIGXCPU too), so a shell is PID 1:
# it runs the child and exits with 128 + N when signal N killed it.
NAMESPACES = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child",
              "/bin/sh", "-c", '"$@"; exit $?', "sandbox-init")

# Runs in the child as `python -c PRELUDE memory_bytes cpu_s file_bytes`, the user's code on stdin.
PRELUDE = r'''
import os, resource, sys


def sandbox(memory_bytes, cpu_s, file_bytes):
    """Reads the user's code, limits this process, installs the audit hook; returns the compiled code.
    What the hook uses is bound here, out of reach of the code's globals."""
    code = sys.stdin.read()
    for limit, soft, hard in ((resource.RLIMIT_AS, memory_bytes, memory_bytes),
                              (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
                              (resource.RLIMIT_FSIZE, file_bytes, file_bytes),
                              (resource.RLIMIT_CORE, 0, 0),
                              (resource.RLIMIT_NPROC, 0, 0)):
        resource.setrlimit(limit, (soft, hard))
    workdir, sep, realpath, fsdecode = os.getcwd() + os.sep, os.sep, os.path.realpath, os.fsdecode
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    process_events = {"subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn",
                      "os.fork", "os.forkpty", "os.kill", "os.killpg"}
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.mkdir": (0,),
                   "os.symlink": (1,), "os.link": (1,), "os.truncate": (0,), "os.chmod": (0,),
                   "os.chown": (0,), "os.utime": (0,)}    # event -> positions of the paths it changes

    def outside(path):
        return not isinstance(path, int) and not (realpath(fsdecode(path)) + sep).startswith(workdir)

    def refusal(event, args):
        if event.startswith("socket."):
            return f"network access ({event})"
        if event.startswith("ctypes.") and (event, args) != ("ctypes.dlopen", (None,)):
            return f"ctypes ({event})"
        if event in process_events:
            return f"starting or signalling processes ({event})"
        if event == "open" and args[2] & write_flags and outside(args[0]):
            return f"writing {args[0]!r} outside the working directory"
        escaping = [args[i] for i in path_events.get(event, ()) if outside(args[i])]
        if escaping:
            return f"{event} on {escaping[0]!r} outside the working directory"
        return None

    def hook(event, args):
        reason = refusal(event, args)
        if reason:
            raise PermissionError(f"{reason} is not allowed in the sandbox")

    sys.addaudithook(hook)
    return compile(code, "<sandbox>", "exec")


exec(sandbox(*map(int, sys.argv[1:])), {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class SandboxResult:
    """What a run printed and how it ended; stdout and stderr are bounded (see `read_bounded`)."""

    stdout: str
    stderr: str
    returncode: int      # -N when signal N killed the child
    error: str | None    # None when the code ran to completion, else a one-line reason


@functools.cache
def namespace_command() -> tuple[str, ...]:
    """The `unshare` prefix that runs the child in new user, network and PID namespaces, or () when
    this machine does not allow them; checked once per process."""
    try:
        works = subprocess.run([*NAMESPACES, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        works = False
    return NAMESPACES if works else ()


def child_env(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing inherited (no tokens, proxies or paths of the trainer),
    home and temp in the working directory, one thread per math library."""
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def child_pids(pid: int) -> list[int]:
    """Pids of the children of process `pid` ([] once it has exited)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def stop(process: subprocess.Popen, namespaced: bool) -> None:
    """Kills whatever the run left running and reaps `process`, leaving no zombie or orphan behind.

    In namespaces `process` is `unshare`, its child the namespace's init shell and its grandchild the
    Python running the code. SIGKILL goes to the grandchild until `unshare` exits: the shell then
    reports the signal (see `exit_status`), the kernel kills anything else in the namespace as the
    shell exits, and each process is reaped by its own parent (killing `unshare` first would orphan
    the shell to the machine's init, which may never reap it). Then SIGKILL to the process group, for
    anything else, and reap `process`.
    """
    deadline = time.monotonic() + STOP_GRACE_S
    while namespaced and process.poll() is None and time.monotonic() < deadline:
        for pid in [grandchild for child in child_pids(process.pid) for grandchild in child_pids(child)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_then_stop(process: subprocess.Popen, timeout_s: float, namespaced: bool) -> bool:
    """Waits up to timeout_s for process, then stops it (see `stop`); True when it timed out."""
    try:
        process.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        return True
    finally:
        stop(process, namespaced)


def read_bounded(file, max_chars: int) -> str:
    """The text of a binary file, or when it is longer than max_chars bytes its first and last
    max_chars // 2 bytes around a `...[N bytes cut]...` line; never reads more than max_chars bytes."""
    size = file.seek(0, os.SEEK_END)
    file.seek(0)
    if size <= max_chars:
        return file.read().decode(errors="replace")
    head = file.read(max_chars // 2)
    file.seek(size - max_chars // 2)
    tail = file.read()
    cut = size - len(head) - len(tail)
    return f"{head.decode(errors='replace')}\n...[{cut} bytes cut]...\n{tail.decode(errors='replace')}"


def exit_status(returncode: int, namespaced: bool) -> int:
    """The child's exit code, -N when signal N killed it (which the namespace's shell reports as 128 + N,
    so there an exit code in 129..128 + NSIG - 1 reads as a signal)."""
    return 128 - returncode if namespaced and 128 < returncode < 128 + signal.NSIG else returncode


def failure_reason(returncode: int, stderr: str, timed_out: bool, timeout_s: float, memory_mb: int,
                   cpu_s: int) -> str | None:
    """One line saying why a run failed, None when it exited with code 0 in time."""
    if timed_out:
        return f"timed out after {timeout_s} s"
    if returncode == 0:
        return None
    if returncode == -signal.SIGXCPU:
        return f"CPU time limit exceeded ({cpu_s} s)"
    if returncode < 0:
        return f"killed by signal {-returncode} ({signal.strsignal(-returncode)})"
    last_line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if last_line.startswith("MemoryError"):
        return f"memory limit exceeded ({memory_mb} MB)"
    if last_line.startswith("OSError: [Errno 27]"):
        return f"file size limit exceeded ({FILE_LIMIT_MB} MB, stdout and stderr included)"
    if last_line.startswith("PermissionError: "):
        return f"permission denied: {last_line.removeprefix('PermissionError: ')}"
    return last_line or f"exited with code {returncode}"


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 256, cpu_s: int = 5,
               max_output_chars: int = MAX_OUTPUT_CHARS) -> SandboxResult:
    """Runs code in a fresh sandboxed Python process (see the module docstring) and returns its
    output, each stream bounded to max_output_chars characters."""
    limits = [str(memory_mb * 2**20), str(cpu_s), str(FILE_LIMIT_MB * 2**20)]
    namespace = namespace_command()
    with tempfile.TemporaryDirectory(prefix="horizonrl-sandbox-") as workdir, tempfile.TemporaryFile() as stdin, \
            tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write(code.encode())
        stdin.seek(0)
        process = subprocess.Popen([*namespace, sys.executable, "-I", "-B", "-u", "-c", PRELUDE, *limits],
                                   stdin=stdin, stdout=stdout, stderr=stderr, cwd=workdir, env=child_env(workdir),
                                   start_new_session=True)
        timed_out = wait_then_stop(process, timeout_s, namespaced=bool(namespace))
        out, err = read_bounded(stdout, max_output_chars), read_bounded(stderr, max_output_chars)
    returncode = exit_status(process.returncode, namespaced=bool(namespace))
    return SandboxResult(out, err, returncode, failure_reason(returncode, err, timed_out, timeout_s, memory_mb, cpu_s))


def sandbox_report(result: SandboxResult) -> str:
    """What the model sees: stdout, then stderr after a `[stderr]` line, then `Error: <reason>` on
    failure; `(no output)` when there is nothing."""
    parts = [result.stdout.rstrip("\n"),
             result.stderr and f"[stderr]\n{result.stderr.rstrip()}",
             result.error and f"Error: {result.error}"]
    return "\n".join(part for part in parts if part) or "(no output)"


@tool
def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it printed; limits: 5 s, 256 MB, no network,
    no files written outside its working directory.

    Args:
        code: The complete program; print() the values you want to see.
    """
    return sandbox_report(run_python(code))
