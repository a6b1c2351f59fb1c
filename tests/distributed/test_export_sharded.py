"""`horizonrl export` of a checkpoint written by the 2 ranks of a torchrun job (FSDP2 shards), read in one
process: the same model folder as the one the job gathered and saved itself (RUN/checkpoint)."""

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from horizonrl.runstate.checkpoint import save_checkpoint
from horizonrl.runstate.export import export
from launch import torchrun

TOY = Path(__file__).parents[2] / "configs" / "toy.yaml"
SMALL = ["rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.epochs=1", "critic.warmup_batches=1",
         "critic.warmup_iters=1", "model.warm_start=null", "save_every=1", "actor.lr=1e-3"]


def test_a_two_rank_checkpoint_exports_in_one_process_as_the_jobs_final_model(tmp_path, river_tiny):
    tiny = tmp_path / "tiny"
    save_checkpoint(tiny, river_tiny[1], river_tiny[0])
    done = torchrun(2, ["-m", "horizonrl", "train", str(TOY), *SMALL, f"model.path={tiny}", "iterations=2",
                        f"output_dir={tmp_path / 'runs'}", "--quiet"])
    assert done.returncode == 0, done.stderr[-4000:]
    (run,) = (tmp_path / "runs").iterdir()
    out = export(run, tmp_path / "exported")
    state = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    saved = load_file(str(run / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(state[key], value) for key, value in saved.items())
    assert not torch.equal(saved["model.embed_tokens.weight"], river_tiny[1].state_dict()["model.embed_tokens.weight"])
    critic = load_file(str(out / "critic" / "model.safetensors"))
    saved_critic = load_file(str(run / "checkpoint" / "critic" / "model.safetensors"))
    assert critic.keys() == saved_critic.keys() and all(torch.equal(critic[k], saved_critic[k]) for k in critic)
