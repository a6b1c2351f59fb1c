"""Update throughput and memory per rank: 1 vs 2 ranks (torchrun, FSDP2), sharded vs replicated; prints
one JSON object.

    python benchmarks/scale.py --preset medium --tokens 128     # CPU: 1 rank, 2 ranks sharded, 2 ranks replicated
    python benchmarks/scale.py --device cuda --preset qwen2.5-1.5b --worlds 1 --tokens 2048   # MFU on one GPU

Each configuration is a torchrun job of its own (gloo on the CPU, nccl on GPUs): a Llama-shaped model
with random weights (fp32; bf16 mixed precision on a GPU), sharded by learner.distributed.shard as
the trainer shards the actor (a job of 1 rank too), each rank holding `--rows-per-rank` rows of
`--tokens` tokens whose second half is "sampled". The update is the trainer's own:
learner.update.minibatch_updates with the PPO actor loss over one mini-batch of every rank's rows,
after learner.scoring.score gave logp_old. Per rank: update tokens/s (every token of the rank's rows,
per second of optimizer steps, after one warm-up step), peak RSS (ru_maxrss) and the bytes of its
parameters, gradients and AdamW state; on CUDA also model FLOPs utilisation, 6 x parameters x tokens
per second over `--peak-tflops` (default 989: an H100's dense bf16).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time

import torch

PRESETS = {   # Llama-shaped sizes: hidden, layers, heads, kv heads, intermediate, vocab
    "small": (512, 4, 8, 2, 1536, 8192),
    "medium": (1024, 8, 16, 4, 3072, 8192),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936),
}


def worker(args) -> None:
    """One rank of one configuration; rank 0 prints every rank's figures as one JSON line."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from horizonrl.config import DistConfig, MicroBatchBudget
    from horizonrl.learner.distributed import shard, start_ranks, stop_ranks
    from horizonrl.learner.scoring import register_sharded_logprobs, score
    from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, minibatch_updates
    from horizonrl.samples.tensors import Rows

    torch.set_num_threads(1)
    on_gpu = args.device == "cuda"
    cfg = DistConfig(shard=args.shard, mixed_precision=on_gpu)
    ranks, device = start_ranks(cfg, args.device)
    hidden, layers, heads, kv_heads, intermediate, vocab = PRESETS[args.preset]
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=intermediate,
                         max_position_embeddings=args.tokens, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    shard(model, cfg, ranks, device, bf16_parameters=on_gpu)
    register_sharded_logprobs(model)
    generator = torch.Generator().manual_seed(1 + ranks.rank)
    shape = (args.rows_per_rank, args.tokens)
    loss_mask = torch.zeros(shape, dtype=torch.long)
    loss_mask[:, args.tokens // 2:] = 1
    data = Rows(torch.randint(vocab, shape, generator=generator).to(device),
                torch.ones(shape, dtype=torch.long, device=device), loss_mask.to(device))
    budget = MicroBatchBudget(args.micro_batch_rows)
    data = dataclasses.replace(data, **score(data, budget, actor=model, ranks=ranks).given())
    data = dataclasses.replace(data, advantages=torch.randn(shape, generator=generator).to(device) * data.loss_mask)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loss_fn = actor_loss_fn(model, 0.2, 0.2, None, 0.0, "token-mean", 1.0)
    shuffle = torch.Generator().manual_seed(0)

    def update() -> None:
        minibatch_updates(data, args.rows_per_rank * ranks.world_size, budget, 1, shuffle,
                          [UpdateStep(optimizer, loss_fn, 1.0, Stats())], ranks)

    update()                                    # warm-up: optimizer state, allocator, first collectives
    if on_gpu:
        torch.cuda.synchronize()
    ranks.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        update()
    if on_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens_per_s = args.rows_per_rank * args.tokens * args.steps / seconds
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    figures = {"rank": ranks.rank, "update_tokens_per_s": round(tokens_per_s, 1),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "param_grad_adam_mb": round(local * 4 * 4 / 2**20, 1)}
    if on_gpu:
        figures["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        figures["mfu"] = round(6 * n_params * tokens_per_s / (args.peak_tflops * 1e12), 4)
    everyone = ranks.gather(figures)
    if ranks.is_main:
        print(json.dumps({"world_size": ranks.world_size, "shard": args.shard, "parameters": n_params,
                          "ranks": everyone}))
    stop_ranks(ranks)


def run(world: int, shard: bool, args) -> dict:
    """One configuration as a torchrun job; its JSON line."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--standalone", __file__,
               "--worker", "--shard", str(shard).lower(), "--device", args.device, "--preset", args.preset,
               "--rows-per-rank", str(args.rows_per_rank), "--tokens", str(args.tokens), "--steps", str(args.steps),
               "--micro-batch-rows", str(args.micro_batch_rows), "--peak-tflops", str(args.peak_tflops)]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        raise RuntimeError(f"world {world} shard {shard} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", help="one rank (under torchrun)")
    parser.add_argument("--shard", default="true", choices=["true", "false"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2], help="ranks per configuration")
    parser.add_argument("--rows-per-rank", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro-batch-rows", type=int, default=4)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    args.shard = args.shard == "true"
    if args.worker:
        worker(args)
        return
    configurations = [(world, True) for world in args.worlds] + [(world, False) for world in args.worlds if world > 1]
    results = {f"world{world}_{'fsdp' if shard else 'replicated'}": run(world, shard, args)
               for world, shard in configurations}

    def per_rank(name: str, key: str) -> float:
        ranks = results[name]["ranks"]
        return sum(r[key] for r in ranks) / len(ranks)

    summary = {}
    for world in (w for w in args.worlds if w > 1):
        if 1 in args.worlds:
            speed = [per_rank(f"world{w}_fsdp", "update_tokens_per_s") for w in (world, 1)]
            summary[f"tokens_per_s_per_rank_world{world}_over_world1"] = round(speed[0] / speed[1], 3)
        summary[f"peak_rss_per_rank_fsdp_over_replicated_world{world}"] = round(
            per_rank(f"world{world}_fsdp", "peak_rss_mb") / per_rank(f"world{world}_replicated", "peak_rss_mb"), 3)
    print(json.dumps({"preset": args.preset, "device": args.device, "rows_per_rank": args.rows_per_rank,
                      "tokens": args.tokens, "steps": args.steps, **summary, "configurations": results}, indent=2))


if __name__ == "__main__":
    main()
