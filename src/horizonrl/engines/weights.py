"""The learner's weights as an inference server takes them: checkpoint names, every tensor its own.

A model with tied embeddings (Qwen2.5-0.5B/1.5B/3B, our tiny models) has one matrix for the input
embedding and the output head. vLLM loads such a checkpoint with the head tied to the embedding, but
after an in-place reload of the embedding its log-probs are off by 0.5-1.2 nats (measured with vLLM
0.32 on CPU). So the server is given an untied copy (`write_untied`: `tie_word_embeddings: false`
and an explicit `lm_head.weight`), and every sync writes both tensors. A sync rewrites the folder's
weights and asks the server to reload them from there: vLLM's `reload_weights` with a `weights_path`, in
process or through a server's dev-mode `/collective_rpc`.

The weights are streamed, never held whole on the host (a 7B model is 15 GB in bf16, per rank): the
(name, tensor) pairs arrive one at a time (learner/lora.merged_parameters gathers each in turn) and go to
shards of at most `SHARD_BYTES` (a tensor larger than that is a shard of its own), each written to disk
as soon as it is full, so a write holds at most max(SHARD_BYTES, its largest tensor) of host memory
beyond the model's. The shards are Hugging Face's sharded layout, which vLLM and transformers load:
model-<token>-<n>.safetensors files under a fresh random token, and model.safetensors.index.json
mapping every name to its shard. A rewrite replaces the weights whole: the new shards are complete
before the index is atomically replaced to name them, and only then are the old shards deleted; a
write that fails midway deletes its own shards and leaves the previous weights as they were. So a
loader that reads the index and then its shards sees one write's weights (a reader still opening the
old shards when a rewrite deletes them can fail: the engines reload only after a write has returned).
"""

from __future__ import annotations

import copy
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.fsdp import FSDPModule
from transformers import PreTrainedModel

SHARD_BYTES = 1 << 30          # host memory a write may hold beyond the model's (see the module docstring)
INDEX = "model.safetensors.index.json"


def architecture(model) -> str:
    """The name of the transformers class `model` is under its wrappers, which a server looks up in
    config.json's `architectures`: inside a PEFT wrapper, its base model's; under FSDP2, the class
    `fully_shard` derived FSDP<class> from (e.g. LlamaForCausalLM for PeftModelForCausalLM or
    FSDPLlamaForCausalLM)."""
    base = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if base is None:
        raise TypeError(f"{type(model).__name__}: no transformers model (PreTrainedModel) inside to write for an "
                        "inference server; pass the policy, a PEFT wrapper of it or its FSDP2-sharded self")
    return next(cls for cls in type(base).__mro__ if not issubclass(cls, FSDPModule)).__name__


def write_untied(model, tokenizer, folder: Path, dtype: torch.dtype | None = None, tensors=None) -> Path:
    """A Hugging Face model folder of `model` with untied embeddings (see the module docstring):
    config.json (`tie_word_embeddings: false`, `dtype`, `architectures`: the transformers class under any
    wrapper, see `architecture`), the sharded weights of every entry of `model.state_dict()` (tied ones
    under each of their names; or the (name, tensor) pairs `tensors`, iterated once) in `dtype` (None: as
    they are), and the tokenizer. Writing again into the same folder replaces the weights whole
    (`write_weights`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    config.architectures = [architecture(model)]      # a model built from a config has none recorded
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(folder)
    write_weights(folder, model.state_dict().items() if tensors is None else tensors, dtype)
    tokenizer.save_pretrained(folder)
    return folder


def write_weights(folder: Path, tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None) -> None:
    """Stream the (name, tensor) pairs `tensors` (on any device; in `dtype`, None: as they are) into
    `folder` as shards of at most SHARD_BYTES and an index naming them, replacing the weights written there
    before (a single-file model.safetensors included) once every new shard is complete; on an error, the
    new shards are deleted and the old weights stay. A name given twice is a ValueError."""
    token = secrets.token_hex(4)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    held = total = 0
    shards: list[Path] = []

    def flush() -> None:
        nonlocal held
        path = folder / f"model-{token}-{len(shards) + 1:05d}.safetensors"
        shards.append(path)
        save_file(shard, str(path), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, path.name))
        shard.clear()
        held = 0

    try:
        for name, tensor in tensors:
            if name in weight_map or name in shard:
                raise ValueError(f"{name!r} is given twice: a weights file holds each name once")
            target = dtype or tensor.dtype
            size = tensor.numel() * target.itemsize
            if shard and held + size > SHARD_BYTES:
                flush()
            tensor = tensor.detach().to("cpu", target).contiguous()     # on the CPU already: itself, no copy
            if _storage(tensor) in {_storage(kept) for kept in shard.values()}:
                tensor = tensor.clone()     # a tied weight: safetensors stores no shared storage
            shard[name] = tensor
            held += size
            total += size
        if shard:
            flush()
        partial = folder / f"{INDEX}.partial"
        partial.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        os.replace(partial, folder / INDEX)
    except BaseException:
        for path in shards:
            path.unlink(missing_ok=True)
        raise
    current = {path.name for path in shards}
    for path in folder.glob("model*.safetensors"):
        if path.name not in current:
            path.unlink()


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def remove_weights(folder: Path) -> None:
    """Delete the weights `write_weights` wrote into `folder` (its shards and index); the rest stays."""
    (folder / INDEX).unlink(missing_ok=True)
    for path in folder.glob("model*.safetensors"):
        path.unlink()
