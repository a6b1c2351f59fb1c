"""The thread count the commands choose is the one their run computes with (issue 39, defect 8): `horizonrl
train` with a `threads` key, and `horizonrl gateway` on its own (auto: the usable cores but one, shared with its
agents)."""

import os
import subprocess
import sys
import time

import torch

from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS
from horizonrl.train import loop

TOY = str(SOURCE_CONFIGS / "toy.yaml")
SMALL = ["iterations=1", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.micro_batch_size=8",
         "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start.steps=20",
         "model.warm_start.iterations=1"]
UNSET = ("OMP_NUM_THREADS", "HORIZONRL_THREADS", "MKL_NUM_THREADS", "LOCAL_WORLD_SIZE")


def test_train_computes_with_the_configs_thread_count(tmp_path, monkeypatch):
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    seen = []
    run_iterations = loop.run_iterations

    def recorded(ctx, progress):
        seen.append(torch.get_num_threads())
        run_iterations(ctx, progress)
        seen.append(torch.get_num_threads())

    monkeypatch.setattr(loop, "run_iterations", recorded)
    before = torch.get_num_threads()          # 1: tests/conftest.py
    torch.set_num_threads(2)                  # what the process has until the command chooses
    try:
        assert main(["train", TOY, *SMALL, "threads=1", "device=cpu", f"output_dir={tmp_path}", "--quiet"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]


def test_the_gateway_computes_with_its_share_of_the_cores(spawn):
    """Started as a user starts it, nothing set: the count it logs is torch's own count in that process."""
    env = {name: value for name, value in os.environ.items() if name not in UNSET}
    cores = int(subprocess.run([sys.executable, "-c", "import os, torch; "
                                "print(min(torch.get_num_threads(), len(os.sched_getaffinity(0))))"],
                               env=env, capture_output=True, text=True, check=True).stdout)
    process = spawn([sys.executable, "-m", "horizonrl.cli", "gateway", "builtin:babyai-tiny", "--port", "0",
                     "--device", "cpu"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, lines = time.monotonic() + 120, []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "torch threads:" in line:
            break
    process.kill()
    process.communicate()
    logged = [line for line in lines if "torch threads:" in line]
    assert logged, "".join(lines)
    expected = max(1, (cores - 1) // 2)     # one core left to other work, the rest shared with the agents
    assert logged[0].startswith(f"INFO horizonrl.learner.device: torch threads: {expected} (auto: {cores} cores, one "
                                "left to other work, the rest shared by 2 processes, the gateway and the agents "
                                "that call it;"), logged[0]
