import os
import tempfile
from pathlib import Path

import pytest

from horizonrl.tools.sandbox import namespace_command, python, run_python


def leftover_processes() -> list[str]:
    """Pids of processes (zombies included) that are children of this test process or whose working
    directory is a sandbox directory."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent_pid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            in_sandbox = parent_pid != os.getpid() and "horizonrl-sandbox-" in os.readlink(proc / "cwd")
        except (OSError, IndexError, ValueError):
            continue
        if parent_pid == os.getpid() or in_sandbox:
            found.append(proc.name)
    return found


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    """Every test: no process left running or unreaped, no sandbox directory left on disk. Children
    that other tests of the session started before (e.g. multiprocessing's resource tracker) are not
    the sandbox's."""
    before = set(leftover_processes())
    sandbox_dirs = set(Path(tempfile.gettempdir()).glob("horizonrl-sandbox-*"))
    yield
    assert set(leftover_processes()) - before == set()
    assert set(Path(tempfile.gettempdir()).glob("horizonrl-sandbox-*")) <= sandbox_dirs


def test_prints_come_back():
    result = run_python("print('hello')\nprint(6 * 7)")
    assert (result.stdout, result.stderr, result.returncode, result.error) == ("hello\n42\n", "", 0, None)


def test_python_tool_report():
    assert python.fn("print(6 * 7)") == "42"
    assert python.fn("x = 1") == "(no output)"
    report = python.fn("print('before')\n1 / 0")
    assert report.startswith("before\n[stderr]\nTraceback")
    assert report.endswith("ZeroDivisionError: division by zero\nError: ZeroDivisionError: division by zero")


def test_infinite_loop_is_stopped():
    result = run_python("while True:\n    pass", timeout_s=1.0)
    assert result.error == "timed out after 1.0 s"


# A wall-clock limit of LIMIT_S where another limit (CPU, memory, file size) is the one tested: a loaded machine may
# take seconds of wall time to give the child its 1 s of CPU or its 256 MB; the wall clock only ends a hang.
LIMIT_S = 120.0


def test_cpu_limit():
    result = run_python("while True:\n    pass", timeout_s=LIMIT_S, cpu_s=1)
    assert result.error == "CPU time limit exceeded (1 s)"


@pytest.mark.parametrize("code", ["x = bytearray(10**10)", "x = []\nwhile True:\n    x.append(bytearray(10**6))"])
def test_memory_bomb_is_stopped(code):
    result = run_python(code, timeout_s=LIMIT_S, memory_mb=256)
    assert result.error == "memory limit exceeded (256 MB)"


def test_output_flood_is_bounded():
    result = run_python("while True:\n    print('x' * 1000)", timeout_s=LIMIT_S, max_output_chars=1000)
    assert result.error == "file size limit exceeded (16 MB, stdout and stderr included)"
    assert "bytes cut]..." in result.stdout and len(result.stdout) < 1100


def test_files_can_be_written_in_the_working_directory():
    result = run_python("import os\nopen('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read(), os.getcwd())")
    text, workdir = result.stdout.split()
    assert text == "kept" and result.error is None
    assert not Path(workdir).exists()


def test_writing_outside_the_working_directory_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    result = run_python(f"open({str(target)!r}, 'w').write('x')")
    assert result.error == (f"permission denied: writing {str(target)!r} outside the working directory "
                            "is not allowed in the sandbox")
    assert not target.exists()


def test_removing_outside_the_working_directory_is_refused(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    result = run_python(f"import os\nos.remove({str(target)!r})")
    assert result.error == (f"permission denied: os.remove on {str(target)!r} outside the working directory "
                            "is not allowed in the sandbox")
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("code,refused", [
    ("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)", "network access (socket.getaddrinfo)"),
    ("import socket\nsocket.socket().connect(('127.0.0.1', 22))", "network access (socket.__new__)"),
    ("import subprocess\nsubprocess.run(['ls'])", "starting or signalling processes (subprocess.Popen)"),
    ("import os\nos.system('ls')", "starting or signalling processes (os.system)"),
    ("import os\nos.fork()", "starting or signalling processes (os.fork)"),
    ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "starting or signalling processes (os.kill)"),
    ("import ctypes\nctypes.CDLL('libc.so.6')", "ctypes (ctypes.dlopen)"),
])
def test_refused_operations(code, refused):
    result = run_python(code)
    assert result.error == f"permission denied: {refused} is not allowed in the sandbox"


def test_reading_the_standard_library_works():
    result = run_python("import json, fractions\nprint(json.dumps(str(fractions.Fraction(3, 6))))")
    assert (result.stdout, result.error) == ('"1/2"\n', None)


@pytest.mark.skipif(not namespace_command(), reason="this machine cannot create user namespaces")
def test_namespaces_isolate_processes_and_network():
    result = run_python("import os\nprint(os.getppid(), os.getpid())\nprint(open('/proc/net/dev').read())")
    pids, _, _, *interfaces = result.stdout.splitlines()
    assert pids == "1 2"     # the namespace's shell, then the child: its own PID numbering
    assert [line.split(":")[0].strip() for line in interfaces if line.strip()] == ["lo"]
