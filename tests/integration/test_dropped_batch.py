"""A batch in which nothing was played (a group batch whose episodes were all dropped: every env call failed,
every agent failed; a fixed-turn batch whose every env step failed) is one clear error naming what failed,
not a crash deep in the update (issue 28: KeyError 'logp_old', or a division by zero in the batch metrics,
after an update over no rows), and nothing is saved on the way out."""

import pytest
import torch

from horizonrl import envs
from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.envs.river import River
from horizonrl.rollout.failures import RolloutsFailed
from horizonrl.runstate.checkpoint import save_checkpoint
from horizonrl.train.loop import train

torch.set_num_threads(1)


class BrokenRiver(River):
    """A River whose simulator fails at every step: each episode ends at its first turn with an env error."""

    def step(self, action: str):
        raise RuntimeError("the simulator is down")


envs.register("broken-river", BrokenRiver, "a River that fails at every step")


@pytest.mark.parametrize("algorithm,settings,first", [
    # 2 tasks x 3 rollouts = 6 episodes, each dropped at its first step by the env error
    ("grpo", ["group.n_tasks=2", "group.group_size=3", "optim.mini_batch_size=6"],
     "episode of the batch failed (6 of 6)"),
    # 2 streams x 4 turns, each step failing (the stream resets and tries again): no turn played
    ("ppo", ["rollout.n_env=2", "ppo.e_len=4", "optim.mini_batch_size=8", "critic.warmup_batches=0"],
     "env step of the batch failed (8 of 8)"),
])
def test_a_batch_with_nothing_played_is_one_error_naming_the_failures(tmp_path, river_tiny, algorithm, settings, first):
    save_checkpoint(tmp_path / "tiny", river_tiny[1], river_tiny[0])
    cfg = load_config(SOURCE_CONFIGS / "toy.yaml", [
        f"algorithm={algorithm}", "env.id=broken-river", f"model.path={tmp_path / 'tiny'}", "model.warm_start=null",
        "iterations=1", *settings, "device=cpu", f"output_dir={tmp_path / 'runs'}"])
    with pytest.raises(RolloutsFailed) as error:
        train(cfg, progress=False)
    message = str(error.value)
    assert message.startswith(f"iteration 1: every {first}, so the update has no rows to train on; the failures, "
                              "most common first:\n"), message
    assert "raised RuntimeError: the simulator is down" in message
    causes = [line for line in message.splitlines()[1:] if line.startswith("  ")]   # "  cause (count)"
    assert sum(int(line.rpartition("(")[2].rstrip(")")) for line in causes) == int(first[-2]), message
    (run,) = (tmp_path / "runs").iterdir()
    assert message.endswith(f"The run folder {run} has no checkpoint yet; nothing was saved on the way out.")
    assert not (run / "checkpoints").exists() and not (run / "checkpoint").exists()
