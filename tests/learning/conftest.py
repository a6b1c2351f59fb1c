import os

import pytest
import torch
from filelock import FileLock

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.train.loop import train

TOY = str(SOURCE_CONFIGS / "toy.yaml")


@pytest.fixture(scope="session")
def toy_start(tmp_path_factory) -> list[str]:
    """Overrides that start the toy recipe (its seed, 1) from its warm-started tiny model, made once per test
    session: every toy learning test (PPO, asynchronous, GiGPO: the same 32 streams) starts from
    the same one, and trains from the folder exactly as from its own warm start
    (tests/integration/test_warm_start_reuse.py). Under pytest-xdist the workers share the session's folder; the
    first to need it makes it (a group run of no iteration: the warm start alone) while the others wait."""
    session = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        session = session.parent   # pytest-<n>/popen-gw<i>: the workers' common folder is this session's
    made = session / "toy-warm-start"
    with FileLock(f"{made}.lock"):
        if not made.is_dir():
            with torch.random.fork_rng():
                run_dir = train(load_config(TOY, ["algorithm=grpo", "iterations=0", f"output_dir={made}.run"]),
                                progress=False)
            (run_dir / "init").rename(made)
    return [f"model.path={made}", "model.warm_start=null"]
