"""The networks of a torchrun run, built shards first: no rank ever holds a whole network on its device.

    rank 0: the initial policy in CPU memory (loaded, or the tiny model it built), exactly what one
            process would train from; the critic's initial weights (its backbone shares the policy's
            tensors, the value head 0), or with LoRA a copy with the seeded adapters of one process
    every rank: each network's skeleton on the meta device (no memory) -> FSDP2 `shard` (each rank
            keeps its shard of every parameter) -> `to_empty` on the device -> the shards filled from
            rank 0's whole tensors, broadcast one tensor at a time (`set_model_state_dict(...,
            broadcast_from_rank0=True)`), buffers (RoPE's frequencies) likewise
    the reference: the actor's skeleton in the compute dtype (bf16 under mixed precision: it is
            frozen and only ever read in bf16), filled from the same tensors; with LoRA, the actor with
            its adapters disabled (no copy)
    the hf engine's whole copy (a rank samples alone): learner/models.engine_copy, filled from the
            sharded actor one gathered tensor at a time

Peak memory: a device holds its shards and the engine copy; rank 0's CPU memory also holds the
initial policy (and, with LoRA, the critic's copy) until the shards are filled (`horizonrl plan`
reports both). The values equal those of one process: tests/distributed/test_one_update.py.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers import AutoModelForCausalLM

from horizonrl.config import TrainConfig
from horizonrl.learner.distributed import Ranks, shard
from horizonrl.learner.lora import AdaptersOff, add_adapters, freeze_base_in
from horizonrl.learner.models import ValueModel
from horizonrl.learner.scoring import register_sharded_logprobs


def sharded_networks(cfg: TrainConfig, policy: nn.Module | None, ranks: Ranks, device: torch.device
                     ) -> tuple[nn.Module, ValueModel | None, nn.Module | AdaptersOff]:
    """(actor, critic (ppo), reference) of a torchrun run, sharded over `ranks` on `device` and holding
    rank 0's initial weights; `policy` is the initial policy in CPU memory on rank 0, None elsewhere.
    Every network is in eval mode (the sampler and the learner compute the same function)."""
    config, generation_config = ranks.broadcast((policy.config, policy.generation_config) if ranks.is_main else None)
    with torch.device("meta"):
        actor = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        actor.generation_config = generation_config       # the stop ids (learner/models.stop_ids)
        critic = ValueModel.from_policy(actor).eval() if cfg.algorithm_spec.critic else None
        reference = copy.deepcopy(actor).requires_grad_(False) if cfg.model.lora is None else None
    sources = initial_sources(cfg, policy, critic is not None) if ranks.is_main else (None, None)
    bf16_parameters = cfg.bf16_parameters(device.type)
    if cfg.model.lora is not None:
        with torch.device("meta"):
            actor, critic = add_adapters(actor, critic, cfg.model.lora, cfg.seed)
        reference = AdaptersOff(actor)
        if bf16_parameters:
            for model in (actor, critic):
                if model is not None:
                    freeze_base_in(model, torch.bfloat16)
    elif bf16_parameters:
        reference.to(torch.bfloat16)
    targets = [(actor, sources[0]), (critic, sources[1])]
    if cfg.model.lora is None:
        targets.append((reference, sources[0]))
    for model, source in targets:
        if model is not None:
            shard(model.eval(), cfg.dist, ranks, device, bf16_parameters)
            fill_from_rank0(model, source, ranks, device)
    for model in (actor, reference):
        if isinstance(model, nn.Module):
            register_sharded_logprobs(model)
    return actor, critic, reference


def initial_sources(cfg: TrainConfig, policy: nn.Module, with_critic: bool) -> tuple[nn.Module, nn.Module | None]:
    """(actor, critic) holding the initial weights, as one process builds them (assembly/context.start_run):
    the policy itself, and a critic whose backbone is the policy's own (no copy) with its value head 0; with
    LoRA, the critic a copy and the adapters added to both under the run's seed."""
    policy.eval()
    if cfg.model.lora is None:
        return policy, ValueModel(policy.base_model, policy.config.hidden_size) if with_critic else None
    critic = ValueModel.from_policy(policy) if with_critic else None
    return add_adapters(policy, critic, cfg.model.lora, cfg.seed)


def fill_from_rank0(model: nn.Module, source: nn.Module | None, ranks: Ranks, device: torch.device) -> None:
    """Allocate the sharded `model` (on meta) on `device` and copy rank 0's `source` into it: parameters
    (and persistent buffers) by a broadcast of each whole tensor, non-persistent buffers (absent from
    state dicts) by one broadcast of them all."""
    model.to_empty(device=device)
    buffers = ranks.broadcast({name: b.cpu() for name, b in source.named_buffers()} if ranks.is_main else None)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    state = source.state_dict() if ranks.is_main else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
