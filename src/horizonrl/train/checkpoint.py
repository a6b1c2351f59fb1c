"""Checkpoints: the actor and tokenizer as a Hugging Face folder (safetensors), the critic beside it.

A checkpoint folder loads back with `model.path=<folder>`. Writes go to a temporary folder that is
renamed into place, so a crash never leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import save_file


def save_checkpoint(folder: Path, actor, tokenizer, critic=None) -> Path:
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    actor.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if critic is not None:
        state = {k: v.detach().contiguous() for k, v in critic.state_dict().items()}
        save_file(state, str(tmp / "critic.safetensors"))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder
