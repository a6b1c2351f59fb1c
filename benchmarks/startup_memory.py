"""Start-up memory of a torchrun run against `horizonrl plan`, and what activation checkpointing saves,
both along the trainer's own code path; prints one JSON object.

    python benchmarks/startup_memory.py [--ranks 2]

A ~100M-parameter Llama shape (hidden 768, 12 layers, 12 heads, 4 KV heads, MLP 2048, vocabulary 32000,
tied embeddings, random weights, saved once as a model folder) trained with PPO from configs/toy.yaml
by `--ranks` torchrun ranks on gloo (CPU): dist.mixed_precision=true and precision=bf16, so the
reference and the hf engine's copy are stored in bf16 as on a GPU. Each rank runs `assembly/context.
start_run` (load, shard, critic, reference, engine copy, optimisers) and reports its peak RSS growth
over start-up (VmHWM, reset just before, minus VmRSS then); the plan is `horizonrl.plan`'s start-up
figure for the same config (per GPU, plus rank 0's CPU memory on rank 0: on the CPU both are RSS).
Then, on the same context, the bytes autograd keeps for backward in the sharded actor's log-prob
forward (2 rows x 512 tokens), with dist.activation_checkpointing on over off (a second start_run).

Output: {"startup_peak_rss_per_rank_mb": [...], "plan_peak_per_rank_mb": [...], "ratio": max over
ranks of measured / plan, "activation_saved_ratio": checkpointed / not, ...}.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

CONFIG = Path(__file__).parents[1] / "configs" / "toy.yaml"
SHAPE = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=True)
ROWS, TOKENS = 2, 512
MB = 2 ** 20


def overrides(model: Path, out: Path, checkpointing: bool) -> list[str]:
    return [f"model.path={model}", "model.warm_start=null", "rollout.n_env=2", "optim.mini_batch_size=16",
            "dist.mixed_precision=true", "precision=bf16",
            f"dist.activation_checkpointing={str(checkpointing).lower()}",
            f"output_dir={out}"]


def rss_kb(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1])


def saved_bytes(ctx) -> int:
    """Bytes autograd keeps in the sharded actor's log-prob forward (horizonrl.plan.saved_for_backward)."""
    from horizonrl.learner.device import precision
    from horizonrl.learner.scoring import token_logprobs
    from horizonrl.plan import saved_for_backward

    ids = torch.randint(0, len(ctx.tokenizer), (ROWS, TOKENS), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with precision(ctx.cfg.precision):
        return saved_for_backward(lambda: token_logprobs(ctx.actor, ids, mask, mask), ctx.actor)[1]


def rank_main(model: str, out: str) -> None:
    """One torchrun rank: start-up RSS, then the saved bytes with and without checkpointing."""
    from horizonrl.config import load_config
    from horizonrl.envs.pool import open_envs
    from horizonrl.learner.device import precision
    from horizonrl.learner.distributed import start_ranks, stop_ranks
    from horizonrl.plan import plan
    from horizonrl.runstate.checkpoint import StopSignals
    from horizonrl.assembly.context import start_run

    torch.set_num_threads(1)
    result, saved = {}, {}
    for checkpointing in (True, False):
        cfg = load_config(CONFIG, overrides(Path(model), Path(out), checkpointing))
        ranks, device = start_ranks(cfg.dist, "cpu")
        envs = open_envs(cfg.env.ids, cfg.env.kwargs, len(ranks.share(cfg.rollout.n_env)), False, 60.0)
        gc.collect()
        if checkpointing:          # the first context: its start-up is measured
            Path("/proc/self/clear_refs").write_text("5")   # VmHWM := VmRSS
            before = rss_kb("VmRSS")
        with StopSignals() as signals, precision(cfg.precision):
            ctx = start_run(cfg, envs, signals, None, ranks, device)
        if checkpointing:
            the_plan = plan(cfg, ranks.world_size)
            result = {"rank": ranks.rank, "startup_peak_rss_mb": (rss_kb("VmHWM") - before) / 1024,
                      "plan_mb": (the_plan.startup + (the_plan.startup_host if ranks.is_main else 0)) / MB,
                      "plan_startup_per_gpu_mb": the_plan.startup / MB,
                      "plan_startup_host_rank0_mb": the_plan.startup_host / MB,
                      "parameters": the_plan.parameters}
        saved[checkpointing] = saved_bytes(ctx)
        for env in envs:
            env.close()
        del ctx
        gc.collect()
    result["saved_mb_checkpointing"] = saved[True] / MB
    result["saved_mb_without"] = saved[False] / MB
    Path(f"{out}/rank{ranks.rank}.json").write_text(json.dumps(result))
    stop_ranks(ranks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rank-main", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(*args.rank_main)
        return
    from transformers import AutoModelForCausalLM, LlamaConfig

    from horizonrl.learner.models import load_policy
    from horizonrl.runstate.checkpoint import save_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        tokenizer, _ = load_policy("builtin:babyai-tiny", torch.device("cpu"))
        torch.manual_seed(0)
        config = LlamaConfig(**SHAPE, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=None)
        save_checkpoint(model, AutoModelForCausalLM.from_config(config, dtype=torch.float32), tokenizer)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks), "--standalone",
                   __file__, "--rank-main", str(model), tmp]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    measured = [r["startup_peak_rss_mb"] for r in ranks]
    planned = [r["plan_mb"] for r in ranks]
    print(json.dumps({
        "startup_peak_rss_per_rank_mb": [round(m, 1) for m in measured],
        "plan_peak_per_rank_mb": [round(p, 1) for p in planned],
        "ratio": round(max(m / p for m, p in zip(measured, planned)), 3),
        "activation_saved_ratio": round(max(r["saved_mb_checkpointing"] / r["saved_mb_without"] for r in ranks), 3),
        "parameters": ranks[0]["parameters"], "ranks": args.ranks,
        "plan_startup_per_gpu_mb": round(ranks[0]["plan_startup_per_gpu_mb"], 1),
        "plan_startup_host_rank0_mb": round(ranks[0]["plan_startup_host_rank0_mb"], 1),
        "saved_mb": [[round(r["saved_mb_checkpointing"], 1), round(r["saved_mb_without"], 1)] for r in ranks],
    }))


if __name__ == "__main__":
    main()
