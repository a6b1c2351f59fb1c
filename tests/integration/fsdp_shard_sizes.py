"""What FSDP2 really allocates on each rank: run under torchrun (gloo, CPU), writes one JSON file per rank.

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc_per_node 2 --standalone fsdp_shard_sizes.py OUT

Each case builds a tiny causal LM whose dims do not divide by the world size (vocab 1001, intermediate
97), applies `fully_shard` to every decoder layer and then to the root (as learner/distributed.shard),
runs one forward/backward and one AdamW step, and records per rank the bytes of the distinct storages
behind the sharded parameters (FSDP2's padded `_sharded_param_data`), behind the gradients (views into
each group's reduce-scatter output) and behind AdamW's exp_avg / exp_avg_sq, next to the bytes of the
local (unpadded) shards; and the bytes of the all-gather outputs of the root's own parameters and of
one layer's (what a unit holds unsharded). Cases: Llama untied and tied, Qwen2 (q/k/v biases) tied, the
critic (backbone + value head), and PEFT LoRA (r=3, frozen base in bf16, bf16 mixed precision).
OUT.rank<R>.json gets {case: {...}}.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

DIMS = dict(vocab_size=1001, hidden_size=64, intermediate_size=97, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)
LORA = dict(r=3, lora_alpha=6, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"])


class Critic(nn.Module):
    """The policy's backbone (model.model) and a value head Linear(hidden, 1), as learner.models.ValueModel."""

    def __init__(self, policy):
        super().__init__()
        self.backbone = policy.model
        self.value_head = nn.Linear(policy.config.hidden_size, 1)

    def forward(self, input_ids):
        return self.value_head(self.backbone(input_ids=input_ids).last_hidden_state).squeeze(-1)


def build(case: str) -> nn.Module:
    torch.manual_seed(0)
    if case.startswith("qwen2"):
        config = Qwen2Config(**DIMS, tie_word_embeddings=True)
    else:
        config = LlamaConfig(**DIMS, tie_word_embeddings=case.startswith("llama_tied"))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if case == "critic":
        return Critic(model)
    if case.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**LORA))
        for p in model.parameters():
            if not p.requires_grad:          # frozen base weights kept in bf16 (mixed precision)
                p.data = p.data.to(torch.bfloat16)
    return model


def layers_of(model: nn.Module) -> list[nn.Module]:
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    raise ValueError("no decoder layers")


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer counted once)."""
    seen = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def gathered_bytes(module: FSDPModule) -> int:
    """Bytes of the all-gather outputs behind `module`'s own unsharded parameters (the compute dtype)."""
    module.unshard()
    group = module._get_fsdp_state()._fsdp_param_group
    gathered = storage_bytes(t for fp in group.fsdp_params for t in fp.all_gather_outputs)
    module.reshard()
    return gathered


def measure(case: str, mesh) -> dict:
    model = build(case)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if case.startswith("lora") \
        else MixedPrecisionPolicy()
    for layer in layers_of(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    fsdp_params = [fp for m in model.modules() if isinstance(m, FSDPModule)
                   for group in [m._get_fsdp_state()._fsdp_param_group] if group for fp in group.fsdp_params]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    ids = torch.randint(0, DIMS["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    out = model(ids) if case == "critic" else model(input_ids=ids).logits
    out.float().square().mean().backward()
    optimizer.step()
    states = [t for state in optimizer.state.values() for k, t in state.items() if k != "step"]
    return {
        "root_gathered": gathered_bytes(model),
        "layer_gathered": gathered_bytes(layers_of(model)[0]),
        "param_numel": sum(p.numel() for p in model.parameters()),
        "params_allocated": storage_bytes(fp._sharded_param_data for fp in fsdp_params),
        "params_local": sum(local(p).numel() * p.element_size() for p in model.parameters()),
        "grads_allocated": storage_bytes(local(p.grad) for p in trainable),
        "grads_local": sum(local(p.grad).numel() * p.grad.element_size() for p in trainable),
        "optimizer_allocated": storage_bytes(local(t) for t in states),
        "optimizer_local": sum(local(t).numel() * t.element_size() for t in states),
    }


def main(out: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    cases = sys.argv[2].split(",") if len(sys.argv) > 2 else ["llama_untied", "llama_tied", "qwen2_tied", "critic",
                                                                "lora_untied"]
    result = {case: measure(case, mesh) for case in cases}
    with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1])
