"""The learner's weights as an inference server takes them: checkpoint names, every tensor its own.

A model with tied embeddings (Qwen2.5-0.5B/1.5B/3B, our tiny models) has one matrix for the input
embedding and the output head. vLLM loads such a checkpoint with the head tied to the embedding, but
after an in-place reload of the embedding its log-probs are off by 0.5-1.2 nats (measured with vLLM
0.32 on CPU). So the server is given an untied copy (`write_untied`: `tie_word_embeddings: false`
and an explicit `lm_head.weight`), and every sync writes both tensors. A sync rewrites the folder's
weights (a new file replaces the old one, so that a reader never sees half of one) and asks the
server to reload them from there: vLLM's `reload_weights` with a `weights_path`, in process or through
a server's dev-mode `/collective_rpc`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_untied(model, tokenizer, folder: Path, dtype: torch.dtype | None = None, tensors=None) -> Path:
    """A Hugging Face model folder of `model` with untied embeddings (see the module docstring):
    config.json (`tie_word_embeddings: false`, `dtype`), model.safetensors with every entry of
    `model.state_dict()` (tied ones under each of their names; or the (name, tensor) pairs `tensors`)
    in `dtype` (None: as they are), and the tokenizer. Writing again into the same folder replaces
    the weights file whole."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    config.architectures = [type(model).__name__]      # a model built from a config has none recorded
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(folder)
    state = {name: tensor.detach().to("cpu", dtype or tensor.dtype).clone().contiguous()
             for name, tensor in (model.state_dict().items() if tensors is None else tensors)}
    partial = folder / "model.safetensors.partial"
    save_file(state, str(partial), metadata={"format": "pt"})
    os.replace(partial, folder / "model.safetensors")
    tokenizer.save_pretrained(folder)
    return folder
