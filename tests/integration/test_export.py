"""`horizonrl export`: a run's resumable checkpoint (DCP shards) as a Hugging Face model folder equal to
the run's own final `checkpoint/` folder; a LoRA checkpoint as a PEFT adapter folder or a merged model."""

import copy

import pytest
import torch
import torch.distributed.checkpoint as dcp
from peft import PeftModel
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from horizonrl.agents.agent import chat_prompt_ids
from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS, dump, load_config
from horizonrl.learner.lora import add_lora
from horizonrl.learner.models import load_policy
from horizonrl.train.checkpoint import CheckpointError, save_checkpoint
from horizonrl.train.export import export
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
    critic = load_file(str(exported / "critic.safetensors"))
    saved_critic = load_file(str(checkpoint / "critic.safetensors"))
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


@pytest.fixture
def lora_run(tmp_path, river_tiny):
    """A run folder of a LoRA run (config.yaml with model.lora, init/) whose checkpoint holds the DCP
    state dict of the PEFT-wrapped actor with trained (random, nonzero) adapters; returns (run, actor)."""
    run = tmp_path / "lora_run"
    cfg = load_config(TOY, ["model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj, up_proj]}"])
    save_checkpoint(run / "init", river_tiny[1], river_tiny[0])
    (run / "config.yaml").write_text(dump(cfg))
    actor = add_lora(load_policy(str(run / "init"), torch.device("cpu"))[1], cfg.model.lora)
    with torch.no_grad():
        for name, parameter in actor.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.1)
    dcp.save({"actor": get_model_state_dict(actor)}, checkpoint_id=run / "checkpoints" / "iter_000003" / "dcp",
             no_dist=True)
    return run, actor.eval()


def test_lora_merge_gives_the_merged_model(lora_run, tmp_path):
    run, actor = lora_run
    merged = copy.deepcopy(actor).merge_and_unload().state_dict()
    export(run, tmp_path / "merged", merge=True)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    state = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).state_dict()
    assert state.keys() == merged.keys() and all(torch.equal(state[k], merged[k]) for k in merged)
    initial = load_policy(str(run / "init"), torch.device("cpu"))[1].state_dict()
    assert not torch.equal(state["model.layers.0.self_attn.q_proj.weight"],
                           initial["model.layers.0.self_attn.q_proj.weight"])   # the adapters are in


def test_lora_without_merge_gives_the_adapter_folder(lora_run, tmp_path):
    run, actor = lora_run
    export(run, tmp_path / "adapters")
    assert (tmp_path / "adapters" / "adapter_config.json").is_file() and \
        not (tmp_path / "adapters" / "model.safetensors").exists()
    tokenizer, base = load_policy(str(run / "init"), torch.device("cpu"))
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapters").eval()
    ids = torch.tensor([prompt(tokenizer)])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, actor(ids).logits)
    assert prompt(AutoTokenizer.from_pretrained(tmp_path / "adapters")) == prompt(tokenizer)
