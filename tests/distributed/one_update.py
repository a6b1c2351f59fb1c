"""One training iteration of the real trainer, in one process or on every rank of a torchrun job,
on a global batch that does not depend on the world size; writes the updated actor's weights.

    python one_update.py CONFIG OUT.safetensors [key=value ...]      (and OUT.json: the metrics record)
    python -m torch.distributed.run --nproc_per_node 2 --standalone one_update.py CONFIG OUT [key=value ...]

The responses come from `HashedPolicy` (a pure function of the prompt and the request seed, which
names the episode's seed, the stream or rollout and the turn) instead of the model, so every world
size plays exactly the same episodes: each rank plays its share of the streams (or tasks) with the
seeds they have in one process. The update itself is the real one: scoring, advantages, FSDP2
micro-batches, optimizer step.
"""

from __future__ import annotations

import json
import sys
import zlib
from array import array
from pathlib import Path

import torch
from safetensors.torch import save_file

from horizonrl.config import load_config
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import ScriptedEngine, scripted_generation
from horizonrl.envs.pool import open_envs
from horizonrl.learner.distributed import start_ranks, stop_ranks
from horizonrl.learner.lora import merged_parameters
from horizonrl.runstate.checkpoint import StopSignals
from horizonrl.assembly.context import start_run
from horizonrl.train.loop import family_iteration


class HashedPolicy(ScriptedEngine):
    """Answers "ACTION: <one of the env's actions>", chosen by a hash of the prompt ids and the request seed."""

    def __init__(self, tokenizer, actions: list[str]):
        super().__init__(tokenizer, respond=None)
        self.actions = actions

    async def generate(self, prompt_ids: list[int], params: SamplingParams):
        key = zlib.crc32(array("q", [*prompt_ids, params.seed or 0]).tobytes())
        return scripted_generation(self.tokenizer, f"ACTION: {self.actions[key % len(self.actions)]}", params)


def main(config: str, out: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    cfg = load_config(config, overrides)
    ranks, device = start_ranks(cfg.dist, "cpu")
    streams = ranks.share(cfg.rollout.n_env)
    envs = open_envs(cfg.env.ids, cfg.env.kwargs, len(streams), False, 60.0, streams.start)
    with StopSignals() as signals:
        ctx = start_run(cfg, envs, signals, None, ranks, device)
    ctx.collector.engine = HashedPolicy(ctx.tokenizer, list(envs[0].actions))
    record = family_iteration(cfg)(ctx, 1).record
    state = {name: tensor.clone() for name, tensor in merged_parameters(ctx.actor)}   # adapters merged
    if ranks.is_main:
        save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, out)
        Path(out).with_suffix(".json").write_text(json.dumps(record))
    stop_ranks(ranks)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
