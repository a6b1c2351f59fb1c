"""One update on 2 ranks (torchrun, gloo, FSDP2) equals one update in 1 process on the same global
batch, for PPO and GRPO, sharded and replicated, with and without LoRA (tests/distributed/one_update.py
plays the batch; LoRA weights are compared merged)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from horizonrl.runstate.checkpoint import save_checkpoint
from launch import torchrun
from same_statistics import assert_same_statistics

HERE = Path(__file__).parent
TOY = HERE.parents[1] / "configs" / "toy.yaml"
SETTINGS = {
    "ppo": ["critic.warmup_batches=0", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=16",
            "optim.micro_batch_size=3", "optim.epochs=1"],
    "grpo": ["algorithm=grpo", "group.n_tasks=2", "group.group_size=4", "group.max_turns=5", "rollout.n_env=4",
             "optim.mini_batch_size=1024", "optim.max_tokens_per_micro_batch=400", "optim.epochs=1"],
}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, river_tiny):
    folder = tmp_path_factory.mktemp("model") / "tiny"
    save_checkpoint(folder, river_tiny[1], river_tiny[0])
    return folder


def one_update(tmp_path: Path, nproc: int, overrides: list[str]) -> tuple[dict, dict]:
    """(the actor's weights after the update, the iteration's metrics record)."""
    out = tmp_path / f"weights_{nproc}.safetensors"
    args = [str(HERE / "one_update.py"), str(TOY), str(out), *overrides, f"output_dir={tmp_path / 'runs'}"]
    if nproc == 1:
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    else:
        done = torchrun(nproc, args)
    assert done.returncode == 0, done.stderr[-4000:]
    return load_file(str(out)), json.loads(out.with_suffix(".json").read_text())


# the toy recipe shares prompts' prefixes (optim.shared_prefix: two passes of the body where a rank's micro-batch
# shares, as many on every rank); the replicated variant runs the plain forward
@pytest.mark.parametrize("algorithm,shard,lora", [("ppo", True, False), ("grpo", True, False), ("ppo", False, False),
                                                  ("ppo", True, True), ("grpo", True, True)],
                         ids=["ppo-fsdp", "grpo-fsdp", "ppo-replicated-plain", "ppo-fsdp-lora", "grpo-fsdp-lora"])
def test_two_ranks_update_like_one_process(algorithm, shard, lora, tmp_path, tiny_folder, river_tiny):
    overrides = [*SETTINGS[algorithm], f"model.path={tiny_folder}", "model.warm_start=null", "actor.lr=1e-3",
                 f"dist.shard={str(shard).lower()}", f"optim.shared_prefix={str(shard).lower()}",
                 *(["model.lora={r: 4, alpha: 8}"] if lora else [])]
    (one, record_one), (two, record_two) = one_update(tmp_path, 1, overrides), one_update(tmp_path, 2, overrides)
    before = {k: v for k, v in river_tiny[1].state_dict().items() if k in one}
    assert one.keys() == two.keys() == before.keys()
    moved = max(float((one[k] - before[k]).abs().max()) for k in one)
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    print(f"{algorithm} shard={shard} lora={lora}: max |w_1 - w_0| = {moved:.3g}, "
          f"max |w_2ranks - w_1proc| = {diff:.3g}")
    assert moved > 1e-4            # the update did something
    assert diff <= 1e-5
    # Adam hides a uniform gradient scale in the weights: the gradient norm and the loss do not
    compared = assert_same_statistics(record_one, record_two)
    assert "train/actor/grad_norm" in compared and "env/success_rate" in compared
