"""Training across processes: torchrun's ranks, the reductions that make cross-rank statistics
global, and FSDP2 sharding of the networks.

A run launched by torchrun (WORLD_SIZE set) is SPMD: every rank runs the same loop on its share of
the env streams, holds an FSDP2 shard of actor, critic and reference, and joins every collective in
the same order. Collectives hang unless every rank calls them the same number of times, so counts
that differ between ranks (micro-batches, mini-batches) are agreed with `Ranks.max` and the ranks
with fewer pad with empty passes. A plain process is `LOCAL`: rank 0 of 1, every reduction the
identity, nothing sharded.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from horizonrl.config import ConfigError, DistConfig
from horizonrl.learner.device import resolve_device


@dataclass(frozen=True)
class Ranks:
    """This process among the run's processes, and the collectives the trainer needs."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    distributed: bool = False   # a process group exists (launched by torchrun)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, n: int) -> range:
        """This rank's contiguous part of n items (0..n-1): sizes differ by at most one, lower ranks first."""
        base, extra = divmod(n, self.world_size)
        first = self.rank * base + min(self.rank, extra)
        return range(first, first + base + (self.rank < extra))

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over the ranks (float64)."""
        if not self.distributed:
            return list(values)
        return self.sum_tensor(torch.tensor(values, dtype=torch.float64, device=self._device)).tolist()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks (a new tensor; `t` itself in a plain process)."""
        if not self.distributed:
            return t
        t = t.clone()
        dist.all_reduce(t)
        return t

    def max(self, value: int) -> int:
        """The largest `value` of any rank."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self._device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj) -> list:
        """Every rank's `obj` (picklable; tensors in it on the CPU), in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    @property
    def _device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


LOCAL = Ranks()


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ


def start_ranks(cfg: DistConfig, device_name: str) -> tuple[Ranks, torch.device]:
    """(ranks, device): LOCAL and `device_name` resolved for a plain process; under torchrun, the
    process group joined (nccl on GPUs, gloo on the CPU, or `cfg.backend`) with a timeout of
    `cfg.timeout_s` on every collective, and this rank's GPU (cuda:LOCAL_RANK) or the CPU."""
    if not launched_by_torchrun():
        return LOCAL, resolve_device(device_name)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = resolve_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout_s),
                                device_id=device if backend == "nccl" else None)
    return Ranks(dist.get_rank(), dist.get_world_size(), local_rank, True), device


def stop_ranks(ranks: Ranks) -> None:
    if ranks.distributed and dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a causal LM, its body, or a PEFT wrapper of either
    (the modules FSDP2 shards one by one)."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    raise ValueError(f"{type(model).__name__}: no decoder layers (a `layers` ModuleList) to shard")


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute every decoder layer in backward instead of keeping its activations: each layer's
    forward runs under torch.utils.checkpoint (non-reentrant) whenever gradients are on, in eval mode
    as in train mode. (transformers' own gradient checkpointing acts only when `self.training`, and the
    trainer keeps its networks in eval mode: the sampler and the learner compute the same function.)
    The layer keeps its module path, so state-dict names do not change; apply before `fully_shard`,
    whose hooks then run around the checkpointed forward."""
    for layer in decoder_layers(model):
        layer.forward = functools.partial(_checkpointed, layer.forward)


def _checkpointed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def shard(model: nn.Module, cfg: DistConfig, ranks: Ranks, device: torch.device, bf16_parameters: bool) -> nn.Module:
    """FSDP2 over `ranks`: `fully_shard` on every decoder layer, then on the root (in place).

    dist.shard=false keeps every parameter whole on every rank (a (world, 1) replicate x shard
    mesh: gradients all-reduced). Gradients are summed over the ranks, not averaged: every rank's
    loss is already normalised by the global token count (see learner/update.py). Mixed precision
    computes in bf16 and reduces gradients in fp32 over fp32 master weights; cpu_offload keeps the
    sharded parameters, gradients and optimizer state in CPU memory. `bf16_parameters`: mixed precision, as
    TrainConfig.bf16_parameters resolves dist.mixed_precision."""
    from torch.distributed.device_mesh import init_device_mesh

    if cfg.cpu_offload and device.type != "cuda":
        raise ConfigError("dist.cpu_offload keeps GPU shards in CPU memory; this run is on the CPU already")
    shape = (ranks.world_size,) if cfg.shard else (ranks.world_size, 1)
    names = ("shard",) if cfg.shard else ("replicate", "shard")
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_parameters \
        else MixedPrecisionPolicy()
    options = dict(mesh=mesh, mp_policy=mp, offload_policy=CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy())
    if cfg.activation_checkpointing:
        checkpoint_activations(model)
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)   # gloo has no pre-multiplied sum
    return model


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathered from every rank for a DTensor (a collective), else itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state_dict(model: nn.Module, ranks: Ranks) -> dict[str, torch.Tensor]:
    """`model`'s whole state dict on rank 0, in CPU memory ({} on the other ranks; every rank calls)."""
    if not ranks.distributed:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float) -> float:
    """Scale the gradients so that their global L2 norm is at most `max_norm`; returns the norm
    before clipping. Sharded (DTensor) gradients contribute their global norm (a collective); plain
    ones are clipped by torch.nn.utils.clip_grad_norm_ itself."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    norms = torch.stack([full_tensor(torch.linalg.vector_norm(g)).to(torch.float32) for g in grads])
    total = float(torch.linalg.vector_norm(norms))
    coef = max_norm / (total + 1e-6)          # as torch.nn.utils.clip_grad_norm_
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total
