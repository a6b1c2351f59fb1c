"""A group batch whose episodes were all dropped (every env call failed, every agent failed) is one clear
error naming what dropped them, not a crash deep in the update (issue 28: KeyError 'logp_old', or a
division by zero in the batch metrics, after an update over no rows)."""

import pytest
import torch

from horizonrl import envs
from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.envs.river import River
from horizonrl.train.checkpoint import save_checkpoint
from horizonrl.train.loop import train

torch.set_num_threads(1)


class BrokenRiver(River):
    """A River whose simulator fails at every step: each episode ends at its first turn with an env error."""

    def step(self, action: str):
        raise RuntimeError("the simulator is down")


envs.register("broken-river", BrokenRiver, "a River that fails at every step")


def test_a_group_batch_with_every_episode_dropped_is_one_error_naming_the_failures(tmp_path, river_tiny):
    save_checkpoint(tmp_path / "tiny", river_tiny[1], river_tiny[0])
    cfg = load_config(SOURCE_CONFIGS / "toy.yaml", [
        "algorithm=grpo", "env.id=broken-river", f"model.path={tmp_path / 'tiny'}", "model.warm_start=null",
        "iterations=1", "group.n_tasks=2", "group.group_size=3", "optim.mini_batch_size=6", "device=cpu",
        f"output_dir={tmp_path / 'runs'}"])
    with pytest.raises(RuntimeError) as error:
        train(cfg, progress=False)
    message = str(error.value)
    # 2 tasks x 3 rollouts = 6 episodes, each dropped at its first step by the env error
    assert message.startswith("every episode of the batch was dropped (6 of 6)"), message
    assert "raised RuntimeError: the simulator is down" in message
    counts = [int(line.split(" x ")[0]) for line in message.splitlines()[1:]]
    assert sum(counts) == 6, message
