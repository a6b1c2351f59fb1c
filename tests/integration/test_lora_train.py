"""Training with model.lora in one process: adapters on actor and critic, the reference is the actor
with its adapters disabled, the engine samples from merged weights, checkpoints resume exactly, and
the final checkpoint/ is a plain model folder (adapters merged) with the adapters in adapter/."""

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from horizonrl.config import load_config
from horizonrl.learner.models import load_policy
from horizonrl.report.metrics import read_metrics
from horizonrl.runstate.checkpoint import resume_config, save_checkpoint
from horizonrl.train.loop import train

LORA = ["configs/toy.yaml", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.epochs=1",
        "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start=null", "save_every=1", "actor.lr=1e-3",
        "model.lora={r: 4, alpha: 8}"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, river_tiny):
    folder = tmp_path_factory.mktemp("model") / "tiny"
    save_checkpoint(folder, river_tiny[1], river_tiny[0])
    return folder


def lora_run(tmp_path, tiny_folder, iterations: int, name: str):
    cfg = load_config(LORA[0], [*LORA[1:], f"model.path={tiny_folder}", f"iterations={iterations}",
                                f"output_dir={tmp_path / name}"])
    return train(cfg, progress=False)


def test_lora_run_trains_adapters_against_the_base_and_saves_a_plain_model(tmp_path, tiny_folder, river_tiny):
    run = lora_run(tmp_path, tiny_folder, 2, "run")
    records = read_metrics(run / "metrics.jsonl")
    assert records[1]["train/kl_ref"] == 0.0          # B = 0: the actor is still its base, the reference
    assert records[2]["train/kl_ref"] > 0.0           # the adapters moved it away
    assert all(r["rollout/logprob_abs_diff"] < 1e-5 for r in records[1:])   # the engine samples merged weights
    tokenizer, merged = load_policy(str(run / "checkpoint"), torch.device("cpu"))
    base = river_tiny[1].state_dict()
    changed = [k for k, v in merged.state_dict().items() if not torch.equal(v, base[k])]
    assert changed and all("proj" in k for k in changed)          # only the adapted linear layers moved
    adapted = PeftModel.from_pretrained(load_policy(str(tiny_folder), torch.device("cpu"))[1],
                                        str(run / "checkpoint" / "adapter"))
    ids = torch.tensor([tokenizer.encode("ACTION: go left")])
    assert torch.allclose(adapted(ids).logits, merged(ids).logits, atol=1e-5)


def test_lora_run_resumes_exactly(tmp_path, tiny_folder):
    straight = lora_run(tmp_path, tiny_folder, 2, "straight")
    stopped = lora_run(tmp_path, tiny_folder, 1, "stopped")
    resumed = train(resume_config(stopped, ["iterations=2"]), progress=False, resume=stopped)
    a = load_file(str(straight / "checkpoint" / "model.safetensors"))
    b = load_file(str(resumed / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
