"""`horizonrl export`: a run's resumable checkpoint (DCP shards) as a Hugging Face model folder equal to
the run's own final `checkpoint/` folder, a LoRA run's included (merged model, adapter/, critic/)."""

import copy

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from horizonrl.agents.agent import chat_prompt_ids
from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.learner.models import load_policy
from horizonrl.runstate.checkpoint import CheckpointError
from horizonrl.runstate.export import export
from horizonrl.train.loop import train

TOY = str(SOURCE_CONFIGS / "toy.yaml")   # the river recipe: small, fast runs
SMALL = ["iterations=2", "save_every=1", "rollout.n_env=2", "ppo.e_len=4", "env.kwargs.stones=2",
         "env.kwargs.max_steps=4", "optim.mini_batch_size=8", "optim.micro_batch_size=8", "critic.warmup_batches=1",
         "critic.warmup_iters=1", "model.warm_start=null", "actor.lr=1e-3", "device=cpu"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 2-iteration PPO run of a tiny model (its initial policy in init/)."""
    return train(load_config(TOY, [*SMALL, f"output_dir={tmp_path_factory.mktemp('runs')}"]), progress=False)


def prompt(tokenizer) -> list[int]:
    return chat_prompt_ids(tokenizer, [{"role": "user", "content": "cross the river"}])


def assert_same_model_folder(exported, checkpoint):
    """The exported folder loads with transformers and holds exactly the weights of `checkpoint`."""
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    state, saved = model.state_dict(), load_file(str(checkpoint / "model.safetensors"))
    assert saved and all(torch.equal(state[key], value) for key, value in saved.items())
    critic = load_file(str(exported / "critic" / "model.safetensors"))
    saved_critic = load_file(str(checkpoint / "critic" / "model.safetensors"))
    assert critic.keys() == saved_critic.keys() and all(torch.equal(critic[k], saved_critic[k]) for k in critic)


def test_a_run_exports_its_last_checkpoint_as_the_final_model(run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(run), "--to", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert_same_model_folder(out, run / "checkpoint")   # the last iteration's checkpoint is the final state
    assert (out / "generation_config.json").is_file()
    assert prompt(AutoTokenizer.from_pretrained(out)) == prompt(AutoTokenizer.from_pretrained(run / "checkpoint"))
    load_policy(str(out), torch.device("cpu"))          # what `model.path=` and `horizonrl eval` load


def test_one_iteration_folder_exports(run, tmp_path):
    (folder,) = (run / "checkpoints").glob("iter_*")     # only the last complete checkpoint is kept
    assert folder.name == "iter_000002"
    assert export(folder, tmp_path / "exported") == tmp_path / "exported"
    assert_same_model_folder(tmp_path / "exported", run / "checkpoint")


def test_errors_name_the_problem(run, tmp_path, capsys):
    assert main(["export", str(tmp_path), "--to", str(tmp_path / "out")]) == 2
    assert "is neither a run folder (no config.yaml) nor one of its checkpoints" in capsys.readouterr().err
    no_checkpoint = tmp_path / "fresh"
    no_checkpoint.mkdir()
    (no_checkpoint / "config.yaml").write_text((run / "config.yaml").read_text())
    with pytest.raises(CheckpointError, match="has no complete checkpoint"):
        export(no_checkpoint, tmp_path / "out")
    with pytest.raises(CheckpointError, match="is neither a run folder"):
        export(run / "checkpoint", tmp_path / "out")      # a model folder, not a checkpoint
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "model.safetensors").write_bytes(b"")
    assert main(["export", str(run), "--to", str(tmp_path / "taken")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and (tmp_path / "taken" / "model.safetensors").read_bytes() == b""


def test_a_lora_run_exports_its_merged_model_adapters_and_critic(tmp_path):
    run = train(load_config(TOY, [*SMALL, "model.lora={r: 4, alpha: 8}", f"output_dir={tmp_path / 'runs'}"]),
                progress=False)
    out = export(run, tmp_path / "exported")
    assert_same_model_folder(out, run / "checkpoint")
    adapters, saved = (load_file(str(folder / "adapter" / "adapter_model.safetensors"))
                       for folder in (out, run / "checkpoint"))
    assert adapters.keys() == saved.keys() and all(torch.equal(adapters[k], saved[k]) for k in saved)
    tokenizer, merged = load_policy(str(out), torch.device("cpu"))
    initial = load_policy(str(run / "init"), torch.device("cpu"))[1]
    adapted = PeftModel.from_pretrained(copy.deepcopy(initial), out / "adapter").eval()
    ids = torch.tensor([prompt(tokenizer)])
    with torch.no_grad():
        assert torch.allclose(adapted(ids).logits, merged(ids).logits, atol=1e-5)
        assert not torch.allclose(initial(ids).logits, merged(ids).logits, atol=1e-5)   # the adapters trained
