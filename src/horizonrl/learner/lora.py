"""Low-rank adapters (PEFT LoRA) on the actor and the critic: the base weights stay frozen, only the
adapters (and the critic's value head) train.

The reference policy of a LoRA run is the actor inside `adapters_disabled` (`AdaptersOff`), not a
second copy of the weights. The inference engine and the model folders get `merged_parameters` (the
base model's names, W + alpha/r * B @ A); `save_adapters` writes the adapters alone (PEFT's folder,
which `PeftModel.from_pretrained` loads back onto the base model).

peft is imported only by a run that asks for adapters (it costs ~100 MB of memory in every process
that imports it, vLLM's engine processes forked from ours included).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from horizonrl.config import LoRAConfig
from horizonrl.learner.distributed import full_tensor

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer


def peft_config(lora: LoRAConfig, task_type: str | None = None) -> LoraConfig:
    """PEFT's LoraConfig for `lora` (the update of a targeted linear layer is alpha / r * B @ A)."""
    from peft import LoraConfig

    return LoraConfig(task_type=task_type, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules)


def add_lora(model: nn.Module, lora: LoRAConfig) -> PeftModel:
    """The causal LM `model` with adapters injected in place (B = 0: same outputs as before), wrapped
    in a PeftModel; only the adapter parameters require grad."""
    from peft import get_peft_model

    return get_peft_model(model, peft_config(lora, task_type="CAUSAL_LM"))


def add_critic_lora(critic: nn.Module, lora: LoRAConfig) -> nn.Module:
    """`critic` (a learner.models.ValueModel) with its backbone wrapped in a PeftModel with adapters
    (B = 0: same values as before); only the adapters and the value head require grad. Returns the
    critic, changed in place; its forward is unchanged."""
    from peft import get_peft_model

    critic.backbone = get_peft_model(critic.backbone, peft_config(lora))   # the value head stays trainable
    return critic


def add_adapters(actor: nn.Module, critic: nn.Module | None, lora: LoRAConfig, seed: int
                 ) -> tuple[PeftModel, nn.Module | None]:
    """(actor, critic) of a LoRA run: `add_lora` on the actor, `add_critic_lora` on the critic (None: none).
    The initial adapters are drawn under `seed` alone, so they are the same on every rank and at every
    world size; both networks come back in eval mode (PEFT leaves what it wraps in train mode)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        actor, critic = add_lora(actor, lora), add_critic_lora(critic, lora) if critic is not None else None
    for model in (actor, critic):
        if model is not None:
            model.eval()
    return actor, critic


def is_peft(model: nn.Module) -> bool:
    """Whether `model` is PEFT-wrapped (never, where peft was not imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def adapters_disabled(model: nn.Module):
    """A context in which a PEFT model computes its base model's function (the reference policy of a
    LoRA run); for a plain model, a context that changes nothing."""
    return model.disable_adapter() if is_peft(model) else contextlib.nullcontext()


@dataclass(frozen=True)
class AdaptersOff:
    """The reference policy of a LoRA run: `actor` with its adapters disabled, not a second copy of
    the weights (learner.scoring.token_logprobs computes it inside `adapters_disabled`)."""

    actor: PeftModel


def freeze_base_in(model: nn.Module, dtype) -> None:
    """The frozen (base) weights of `model` stored in `dtype` (bf16 under mixed precision: they are
    only ever read in bf16), the trainable ones as they are."""
    for parameter in model.parameters():
        if not parameter.requires_grad:
            parameter.data = parameter.data.to(dtype)


def lm_body(policy: nn.Module) -> nn.Module:
    """The transformer body of a causal LM (e.g. LlamaModel: forward returns last_hidden_state), plain
    or PEFT-wrapped; a PEFT model's adapters are injected in place, so they act in the body too."""
    causal_lm = policy.get_base_model() if is_peft(policy) else policy
    return causal_lm.base_model


def merged_parameters(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) for every entry of the base model's state dict, named as a plain causal LM of the
    same config names it (tied weights under both names, as state_dict does), in state-dict order.

    Each tensor is whole (a DTensor is gathered with full_tensor, a collective: every rank iterates
    in the same order) and detached; a LoRA-adapted weight is W + scaling * B @ A summed over the
    active adapters, whether or not they are disabled at the time. Tensors are made one at a time;
    an unsharded, unadapted entry is the live parameter itself (read it, do not write it). A plain
    model yields its own state dict.
    """
    base, layers = model, {}
    if is_peft(model):
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer

        base = model.get_base_model()
        layers = {path: module for path, module in base.named_modules() if isinstance(module, LoraLayer)}
        for path, layer in layers.items():
            if not isinstance(layer, LoraLinear) or layer.lora_variant or any(layer.lora_bias.values()):
                raise ValueError(f"{path}: merged_parameters merges plain LoRA on linear layers only, "
                                 f"not {type(layer).__name__} (DoRA, LoRA bias, embeddings)")
    for key, value in base.state_dict(keep_vars=True).items():
        owner = _lora_owner(key, layers)
        if owner is None:
            yield key, full_tensor(value).detach()
        elif key.startswith(f"{owner}.base_layer."):
            leaf = key.removeprefix(f"{owner}.base_layer.")
            tensor = full_tensor(value).detach()
            if leaf == "weight":
                tensor = tensor + _delta_weight(layers[owner]).to(tensor.dtype)
            yield f"{owner}.{leaf}", tensor
        # else: an adapter's own tensor (lora_A, lora_B), merged into its layer's weight above


def _lora_owner(key: str, layers: dict[str, LoraLayer]) -> str | None:
    """The path of the LoRA layer that holds state-dict entry `key`, or None."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:end])
        if path in layers:
            return path
    return None


def _delta_weight(layer: LoraLinear) -> Tensor:
    """Sum over the layer's active adapters of scaling * B @ A (transposed for fan_in_fan_out), as
    peft's own get_delta_weight computes it, from whole tensors."""
    delta = 0
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            b = full_tensor(layer.lora_B[adapter].weight).detach()
            a = full_tensor(layer.lora_A[adapter].weight).detach()
            update = (b @ a) * layer.scaling[adapter]
            delta = delta + (update.T if layer.fan_in_fan_out else update)
    return delta


def adapter_state(model: PeftModel) -> dict[str, Tensor]:
    """The adapter tensors of `model`, whole (every rank of a sharded model calls it: a collective)."""
    return {key: full_tensor(value).detach() for key, value in model.state_dict(keep_vars=True).items()
            if "lora_" in key}                 # peft's own test for a LoRA entry (get_peft_model_state_dict)


def save_adapters(model: PeftModel, folder: str | Path, adapters: dict[str, Tensor] | None = None) -> None:
    """The adapters of `model` (adapter_model.safetensors + adapter_config.json; `adapters`: as
    `adapter_state` gave them, default gathered here) into `folder`; never the base weights."""
    adapters = adapter_state(model) if adapters is None else adapters
    model.save_pretrained(str(folder), state_dict=adapters, save_embedding_layers=False)
