"""Activation checkpointing along the trainer's own path: `start_run` in a one-rank torchrun-style gloo
group (the networks in eval mode, sharded with FSDP2), then the sharded log-prob forward of the actor and
the critic's value forward. Measured: the bytes autograd keeps for backward, and the gradients."""

import socket
from pathlib import Path

import pytest
import torch

from horizonrl.config import load_config
from horizonrl.envs.pool import open_envs
from horizonrl.learner.distributed import start_ranks, stop_ranks
from horizonrl.learner.scoring import token_logprobs
from horizonrl.plan import saved_for_backward
from horizonrl.runstate.checkpoint import StopSignals, save_checkpoint
from horizonrl.assembly.context import start_run

TOY = Path(__file__).parents[2] / "configs" / "toy.yaml"
ROWS, SEQ = 2, 96


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def saved_bytes_and_grads(tmp_path, monkeypatch, model_folder, checkpointing: bool, lora: bool = False
                          ) -> dict[str, tuple[int, list[torch.Tensor]]]:
    """network -> (bytes of the distinct non-parameter storages saved for backward, the gradients)."""
    for key, value in dict(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    overrides = [f"model.path={model_folder}", "model.warm_start=null", "rollout.n_env=2", "optim.mini_batch_size=16",
                 f"output_dir={tmp_path}",
                 "dist.mixed_precision=false", f"dist.activation_checkpointing={str(checkpointing).lower()}",
                 "optim.shared_prefix=false"]     # the toy recipe shares prefixes: not beside checkpointing
    cfg = load_config(TOY, overrides + (["model.lora={r: 4}"] if lora else []))
    ranks, device = start_ranks(cfg.dist, "cpu")
    envs = open_envs(cfg.env.ids, cfg.env.kwargs, cfg.rollout.n_env, False, 60.0)
    try:
        with StopSignals() as signals:
            ctx = start_run(cfg, envs, signals, None, ranks, device)
        assert not ctx.actor.training and not ctx.critic.training        # as the trainer runs them
        torch.manual_seed(0)
        ids = torch.randint(0, len(ctx.tokenizer), (ROWS, SEQ))
        mask = torch.ones_like(ids)
        mask[1, SEQ // 2:] = 0
        out = {}
        for name, model, forward in (("actor", ctx.actor, lambda: token_logprobs(ctx.actor, ids, mask, mask)[0].sum()),
                                     ("critic", ctx.critic, lambda: (ctx.critic(ids, mask) * mask).sum())):
            loss, saved = saved_for_backward(forward, model)
            loss.backward()
            grads = [p.grad.to_local().clone() for p in model.parameters() if p.grad is not None]
            out[name] = saved, grads
        return out
    finally:
        for env in envs:
            env.close()
        stop_ranks(ranks)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, river_tiny):
    folder = tmp_path_factory.mktemp("model") / "tiny"
    save_checkpoint(folder, river_tiny[1], river_tiny[0])
    return folder


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_keeps_a_fraction_of_the_activations_and_the_same_gradients(tmp_path, monkeypatch,
                                                                                    tiny_folder, lora):
    off = saved_bytes_and_grads(tmp_path / "off", monkeypatch, tiny_folder, False, lora)
    on = saved_bytes_and_grads(tmp_path / "on", monkeypatch, tiny_folder, True, lora)
    for network in ("actor", "critic"):
        (bytes_off, grads_off), (bytes_on, grads_on) = off[network], on[network]
        # the tiny model has 2 layers: checkpointed, each keeps only its input (one [T, H] tensor)
        assert bytes_on <= 0.5 * bytes_off, (network, bytes_on, bytes_off)
        assert len(grads_on) == len(grads_off) > 0
        for got, expected in zip(grads_on, grads_off):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
