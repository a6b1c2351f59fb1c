"""Export: a resumable training checkpoint (`RUN/checkpoints/iter_NNNNNN/`) as a model folder that any
Hugging Face tool loads.

A checkpoint's networks are torch.distributed.checkpoint shards, written by every rank of a torchrun
job or by one process. Export loads the run's initial policy (`init/` or `model.path`: architecture and
tokenizer) on the CPU, with a LoRA run's adapters on it, and reads the checkpoint's "actor" and
"critic" entries over it in one process (DCP reshards whatever world size wrote them; the optimizer
states in the same files are not read). The folder then holds what a run's `checkpoint/` holds
(`save_checkpoint`): the actor as a plain model (adapters merged), its tokenizer and generation config,
a LoRA run's adapters in `adapter/`, and the critic in `critic/`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from horizonrl import runfolder
from horizonrl.config import load_config
from horizonrl.learner.lora import add_adapters
from horizonrl.learner.models import ValueModel, load_policy
from horizonrl.runstate.checkpoint import (DCP_FOLDER, CheckpointError, complete_checkpoints,
                                        initial_policy_path, save_checkpoint)


def export(target: Path, out: Path) -> Path:
    """Write the model of checkpoint `target` (a run folder: its last complete checkpoint; or one of its
    `iter_*` folders) into the new folder `out`, atomically; returns `out`."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists; export writes a new folder")
    run, folder = run_and_checkpoint(Path(target).resolve())
    cfg = load_config(run / runfolder.CONFIG, run_folder=True)
    if cfg.model.path is None and not (run / runfolder.INIT).is_dir():
        raise CheckpointError(f"{run / 'init'} (the run's initial policy: architecture and tokenizer) is missing")
    tokenizer, actor = load_policy(initial_policy_path(cfg, run), torch.device("cpu"))
    critic = ValueModel.from_policy(actor) if has_entry(folder, "critic") else None
    if cfg.model.lora is not None:                    # a LoRA run saved PEFT's names
        actor, critic = add_adapters(actor, critic, cfg.model.lora, cfg.seed)
    load_entries(folder, {"actor": actor, **({"critic": critic} if critic is not None else {})})
    return save_checkpoint(out, actor, tokenizer, critic)


def run_and_checkpoint(target: Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) of `target`: a run folder and its last complete checkpoint, or
    a complete `RUN/checkpoints/iter_NNNNNN` folder and its run."""
    if (target / runfolder.CONFIG).is_file():
        run, folders = target, complete_checkpoints(target)
        if not folders:
            raise CheckpointError(f"{run} has no complete checkpoint in {run / runfolder.CHECKPOINTS} (its final model "
                                  f"folder, if any, is {run / 'checkpoint'})")
        folder = folders[-1]
    else:
        run, folder = target.parent.parent, target
        if target.parent.name != runfolder.CHECKPOINTS or not (run / runfolder.CONFIG).is_file() \
                or target not in complete_checkpoints(run):
            raise CheckpointError(f"{target} is neither a run folder (no config.yaml) nor one of its checkpoints "
                                  f"(RUN/{runfolder.CHECKPOINTS}/iter_NNNNNN)")
    if not (folder / DCP_FOLDER / ".metadata").is_file():
        raise CheckpointError(f"{folder} is incomplete: {DCP_FOLDER}/.metadata missing")
    return run, folder


def has_entry(folder: Path, name: str) -> bool:
    """Whether the checkpoint `folder` holds the network `name` ("actor", "critic")."""
    keys = dcp.FileSystemReader(folder / DCP_FOLDER).read_metadata().state_dict_metadata
    return any(key.startswith(f"{name}.") for key in keys)


def load_entries(folder: Path, networks: dict[str, nn.Module]) -> None:
    """Read the entries of checkpoint `folder` that `networks` names into those (unsharded) modules, in
    this one process; the checkpoint's other entries (optimizer states) stay unread. DCP loads into the
    tensors of get_model_state_dict (here the modules' own), and set_model_state_dict sets them."""
    state = {name: get_model_state_dict(model) for name, model in networks.items()}
    dcp.load(state, checkpoint_id=folder / DCP_FOLDER, no_dist=True)
    for name, model in networks.items():
        set_model_state_dict(model, state[name])
