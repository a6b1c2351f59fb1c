"""horizonrl against TRL 1.16's GRPOTrainer on the same work: seconds per step; prints one JSON object.

    pip install trl==1.16.0            # a benchmark-only dependency (it leaves torch and transformers as they are)
    python benchmarks/vs_trl.py [--steps 3] [--real] [--trl-gradient-checkpointing]
    python benchmarks/vs_trl.py --write-13m DIR          # only the 13m model folder (benchmarks/update_efficiency.py)

One step, on both sides: 8 prompts (the same token ids: each side tokenizes the same texts with the same
tokenizer call) x G = 8 completions of at most 32 new tokens, sampled at temperature 1 and ending at EOS;
a reward per completion (the fraction of even token ids in it); GRPO advantages; one AdamW step of the
clipped surrogate over the 64 completions, beta = 0 (no reference), one epoch of one mini-batch; fp32 on
the CPU, one thread.

horizonrl: the phases of train/group.group_iteration, through the library's own functions: the hf engine
sampling from the actor itself (`generate_batch`: the decode loop the collector's requests share), then
`phases.score` (rows, and the networks `needed_scores` asks for: none here, the update's own forward is the
old policy), `group_advantages_to_tokens`, `minibatch_updates` with the run's actor loss. The collector's
agent plumbing (prompt building, action parsing) is left out: TRL has none either.

TRL: `GRPOTrainer.train` for steps + 1 steps (per_device_train_batch_size 64, num_generations 8,
max_completion_length 32, beta 0, use_cpu, bf16 False), each step timed from on_step_begin to on_step_end;
`generate_s` is its `_generate_and_score_completions` (generation, rewards, advantages), `update_s` the
rest of the step (its loss forward, backward and optimizer step). TRL's GRPOConfig turns gradient
checkpointing on by default (a second forward in the backward); here it is off, as in a horizonrl run in one
process, so that both sides compute the same passes: --trl-gradient-checkpointing measures TRL's default.

The two sides take turns, step by step (one of ours after each of TRL's, outside TRL's timing), so that
the machine's other load weighs on both alike; each side's first step warms up and is left out, and the
medians of the `steps` others are reported (`step_time_ratio_<model>` = median step / median step, and the
median of the per-step ratios beside it). Models: `small` = the babyai-tiny checkpoint (0.5M), `13m` = a
Llama of the tiny model's config scaled up (hidden 512, 4 layers, random weights, the tiny tokenizer),
`real` (--real) = SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, TrainerCallback

from horizonrl.config import ActorConfig, GroupConfig, MicroBatchBudget, OptimConfig, RolloutConfig, TrainConfig
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.device import autocast_dtype
from horizonrl.learner.models import frozen_copy, load_policy, pad_token_id, resolve_model_path, stop_ids
from horizonrl.learner.update import Stats, UpdateStep, minibatch_updates
from horizonrl.records import Episode, Turn
from horizonrl.assembly.context import RunContext
from horizonrl.train.group import group_advantages_to_tokens
from horizonrl.train.phases import Stopwatch, score, sync_engine
from horizonrl.assembly.sync_check import SyncCheck

TINY = Path(resolve_model_path("builtin:babyai-tiny"))
REAL = "builtin:smollm2-135m-instruct"
PROMPTS = [f"You are in a {room} room. You see a {colour} {thing} {where}. Your mission: pick up the {colour} {thing}."
           for room, colour, thing, where in [
               ("small", "red", "ball", "ahead"), ("large", "blue", "key", "to the left"),
               ("dark", "green", "box", "behind you"), ("bright", "grey", "ball", "to the right"),
               ("narrow", "purple", "key", "two steps ahead"), ("wide", "yellow", "box", "far ahead"),
               ("locked", "red", "key", "next to the door"), ("empty", "blue", "ball", "in the corner")]]
GROUP_SIZE, MAX_TOKENS = 8, 32


def even_fraction(ids: list[int]) -> float:
    """The reward of a completion on both sides: the fraction of its token ids that are even."""
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)


def scaled_tiny(folder: Path) -> Path:
    """A ~13M-parameter Llama with the tiny model's layout and tokenizer (random weights), saved in `folder`."""
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    config = LlamaConfig.from_pretrained(TINY)
    config.update({"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 64})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for name in ("chat_template.jinja", "generation_config.json"):
        shutil.copy(TINY / name, folder / name)
    return folder


class HorizonrlGRPO:
    """One GRPO iteration of the module docstring's work per `step()`, through the library's functions."""

    def __init__(self, folder: str, run_dir: Path):
        device = torch.device("cpu")
        tokenizer, actor = load_policy(folder, device)
        actor.eval()
        n_rows = len(PROMPTS) * GROUP_SIZE
        cfg = TrainConfig(algorithm="grpo", model={"path": folder}, rollout=RolloutConfig(max_tokens=MAX_TOKENS),
                          group=GroupConfig(n_tasks=len(PROMPTS), group_size=GROUP_SIZE, max_turns=1),
                          optim=OptimConfig(mini_batch_size=n_rows, micro_batch_size=n_rows),
                          actor=ActorConfig(lr=1e-6))
        a = cfg.actor
        self.ctx = RunContext(cfg, run_dir, device, tokenizer, actor, frozen_copy(actor),
                              torch.optim.AdamW(actor.parameters(), lr=a.lr, weight_decay=cfg.optim.weight_decay),
                              HFEngine(actor, pad_token_id(tokenizer), seed=cfg.seed, tokenizer=tokenizer),
                              SyncCheck("the hf engine", max_growth=None, min_gap=1e-3, probe_rows=4),  # TRL has none
                              collector=None, metrics=None, checkpointer=None,
                              shuffle=torch.Generator().manual_seed(0),
                              micro_batch_budget=MicroBatchBudget(n_rows), first_iteration=1)
        self.requests = [p for p in tokenizer(text=PROMPTS)["input_ids"] for _ in range(GROUP_SIZE)]
        self.params = SamplingParams(max_tokens=MAX_TOKENS, temperature=cfg.rollout.temperature,
                                     stop_ids=stop_ids(tokenizer, actor))
        self.params_count = sum(p.numel() for p in actor.parameters())

    def step(self) -> tuple[dict[str, float], float]:
        """(seconds of each phase, mean completion length) of one iteration."""
        ctx, optim = self.ctx, self.ctx.cfg.optim
        clock = Stopwatch()
        generations = ctx.engine.generate_batch(self.requests, [self.params] * len(self.requests))
        clock.lap("generate")
        episodes = [Episode(str(n), "bench", n // GROUP_SIZE, group_id=str(n // GROUP_SIZE),
                            turns=[Turn(p, g.token_ids, g.logprobs, terminated=True)],
                            outcome_reward=even_fraction(g.token_ids))
                    for n, (p, g) in enumerate(zip(self.requests, generations))]
        batch = score(ctx, episodes, critic=None)
        group_advantages_to_tokens(batch, ctx.cfg.algorithm_spec.estimator)
        clock.lap("score")
        minibatch_updates(batch.rows, optim.mini_batch_size, ctx.micro_batch_budget, optim.epochs, ctx.shuffle,
                          [UpdateStep(ctx.actor_opt, ctx.actor_loss(1), optim.grad_clip, Stats())])
        sync_engine(ctx)
        clock.lap("update")
        return clock.laps, statistics.mean(len(g.token_ids) for g in generations)


def compare(folder: str, steps: int, tmp: Path, gradient_checkpointing: bool) -> dict:
    """horizonrl's and TRL's steps, interleaved (one of ours after each of TRL's, outside TRL's timing) so
    that the machine's other load weighs on both alike; the first of each warms up and is left out."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    ours = HorizonrlGRPO(folder, tmp / "run")
    ours_laps, ours_lengths, trl_step_s = [], [], []

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.generate_s.append(time.perf_counter() - started)
            self.lengths.append(float(out["completion_mask"].sum(dim=1).float().mean()))
            return out

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            trl_step_s.append(time.perf_counter() - self.started)
            laps, length = ours.step()
            ours_laps.append(laps)
            ours_lengths.append(length)

    def reward(prompts, completions, completion_ids, **kwargs):
        return [even_fraction(ids) for ids in completion_ids]

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    args = GRPOConfig(output_dir=str(tmp / "trl"), per_device_train_batch_size=len(PROMPTS) * GROUP_SIZE,
                      num_generations=GROUP_SIZE, max_completion_length=MAX_TOKENS, beta=0.0, temperature=1.0,
                      learning_rate=1e-6, max_steps=steps + 1, use_cpu=True, bf16=False, report_to="none",
                      save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
                      gradient_checkpointing=gradient_checkpointing)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tokenizer,
                               train_dataset=Dataset.from_dict({"prompt": PROMPTS * (steps + 1)}),
                               callbacks=[Interleave()])
    trainer.generate_s, trainer.lengths = [], []
    with contextlib.redirect_stdout(sys.stderr):          # the Trainer prints its logs: stdout is the JSON's
        trainer.train()
    trl_laps = [{"timing/generate_s": g, "timing/update_s": s - g} for g, s in zip(trainer.generate_s, trl_step_s)]
    return {"horizonrl": summary(ours_laps[1:], ours_lengths[1:], ours.params_count),
            "trl": summary(trl_laps[1:], trainer.lengths[1:], sum(p.numel() for p in model.parameters())),
            "step_time_ratio_median_of_pairs": statistics.median(
                sum(a.values()) / sum(b.values()) for a, b in zip(ours_laps[1:], trl_laps[1:]))}


def summary(laps: list[dict[str, float]], lengths: list[float], params: int) -> dict:
    phases = {key.removeprefix("timing/"): statistics.median(lap[key] for lap in laps) for key in laps[0]}
    return {"step_s": statistics.median(sum(lap.values()) for lap in laps), **phases,
            "completion_tokens_mean": statistics.mean(lengths), "params": params}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (after one warm-up step)")
    parser.add_argument("--real", action="store_true", help="also SmolLM2-135M-Instruct")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true", help="TRL's default (off here)")
    parser.add_argument("--write-13m", type=Path, metavar="DIR", help="only save the 13m model folder in DIR")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.write_13m:
        print(json.dumps({"folder": str(scaled_tiny(args.write_13m))}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = {"small": str(TINY), "13m": str(scaled_tiny(tmp / "13m"))}
        if args.real:
            models["real"] = resolve_model_path(REAL)
        results = {}
        for name, folder in models.items():
            results[name] = compare(folder, args.steps, tmp / name, args.trl_gradient_checkpointing)
    ratios = {f"step_time_ratio_{name}": r["horizonrl"]["step_s"] / r["trl"]["step_s"] for name, r in results.items()}
    print(json.dumps({**ratios, "steps": args.steps, "threads": torch.get_num_threads(),
                      "trl_gradient_checkpointing": args.trl_gradient_checkpointing,
                      "learner_autocast": str(autocast_dtype(torch.device("cpu"))), **results}, indent=1))


if __name__ == "__main__":
    main()
