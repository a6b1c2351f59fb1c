"""horizonrl command line.

    horizonrl train [CONFIG] [key=value ...]    train (no CONFIG: the default recipe, configs/babyai_tiny.yaml)
    horizonrl train --resume RUN [iterations=N] [save_every=K] [budget.env_steps=S] [budget.wall_clock_s=T]
                                                continue RUN from its last checkpoint (checkpoints/)
    horizonrl sft [CONFIG] [key=value ...]      supervised warm start from the env's expert demonstrations
    horizonrl envs                              list every env id
    horizonrl play ENV [--seed N] [key=value]   play an env in the terminal, seeing the agent's prompt
    horizonrl view RUN                          (re)write RUN/report.html (curves, sample trajectories)
    horizonrl eval RUN_OR_CHECKPOINT [key=value ...] [--episodes N] [--env ID ...] [--max-steps K] [--seed S] [--mode M]
                                                whole episodes on held-out seeds, greedy and sampled
    horizonrl plan CONFIG [key=value ...] --gpus G [--gpu-memory-gb 80] [--seq-len S] [--json]
                                                per-GPU memory of a run from config.json alone, and what makes it fit
    horizonrl export RUN --to DIR               a run's last checkpoint as a Hugging Face model folder
    horizonrl gateway MODEL [--engine hf|vllm] [--host H] [--port P] [--api-key KEY] [--traces FILE] ...
                                                serve MODEL over the OpenAI API, recording every call's exact tokens

Each command that runs a model logs torch's CPU thread count once (learner/device.py, use_threads): set it with
threads=N (train, sft), --threads N (eval, gateway) or HORIZONRL_THREADS=N (any of them, a resume included).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from horizonrl.config import ConfigError, load_config, parse_threads


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: the argument as `kind`, refused (exit 2, naming the argument) unless finite and > 0."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
        return value
    return parse


def threads(text: str) -> int | str:
    """An argparse type: --threads, "auto" or a count > 0 (config.parse_threads), refused (exit 2) otherwise."""
    try:
        return parse_threads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@record   # under torchrun: a rank's uncaught exception reaches torchrun's failure summary, naming the rank
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="horizonrl", description="Multi-turn RL for LLM agents.")
    commands = parser.add_subparsers(dest="command", required=True)
    train_cmd = commands.add_parser("train", help="train an agent (PPO, a group algorithm or GiGPO)")
    train_cmd.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]",
                           help="a recipe YAML (default configs/babyai_tiny.yaml) and dotted overrides, e.g. "
                                "actor.lr=1e-5")
    train_cmd.add_argument("--resume", metavar="RUN", help="continue the run folder RUN from its last checkpoint, "
                                                           "with its config.yaml (only iterations, save_every and "
                                                           "budget.* can be changed)")
    train_cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    sft_cmd = commands.add_parser("sft", help="supervised warm start from the env's expert demonstrations")
    sft_cmd.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]",
                         help="a recipe YAML and dotted overrides, e.g. sft.episodes=512 (the sft: section)")
    sft_cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    commands.add_parser("envs", help="list every env id")
    play_cmd = commands.add_parser("play", help="play an env in the terminal, shown the agent's exact prompt")
    play_cmd.add_argument("env_id")
    play_cmd.add_argument("kwargs", nargs="*", metavar="key=value", help="env constructor arguments")
    play_cmd.add_argument("--seed", type=int, default=0)
    play_cmd.add_argument("--memory", type=int, default=1, help="past turns shown in the prompt")
    view_cmd = commands.add_parser("view", help="(re)write a run folder's report.html and print its path")
    view_cmd.add_argument("run", metavar="RUN", help="a run folder, runs/<name>-<time>")
    eval_cmd = commands.add_parser("eval", help="play whole episodes on held-out seeds, greedy and sampled, and "
                                                "report success, length, return, valid actions and failure types")
    eval_cmd.add_argument("target", metavar="RUN_OR_CHECKPOINT",
                          help="a run folder (its checkpoint/), RUN/init, RUN/checkpoint, any checkpoint folder, "
                               "builtin:NAME or a .gguf file")
    eval_cmd.add_argument("--episodes", type=int, default=64, help="episodes per env and mode")
    eval_cmd.add_argument("--env", nargs="+", dest="env_ids", metavar="ID", help="env ids (default: the run's env)")
    eval_cmd.add_argument("--max-steps", type=int, help="turns after which an episode is cut (default: the env's)")
    eval_cmd.add_argument("--seed", type=int, default=0, help="seeds the sampler of the sampled mode")
    eval_cmd.add_argument("--mode", choices=["greedy", "sampled", "both"], default="both")
    eval_cmd.add_argument("--threads", type=threads, default="auto",
                          help="torch's CPU threads (default auto: the cores but one; on a GPU torch's own)")
    eval_cmd.add_argument("engine_settings", nargs="*", metavar="key=value",
                          help="the engine that samples (right after the target): rollout.engine=hf|vllm|openai, "
                               "rollout.vllm.*, rollout.openai.*, precision=auto|fp32|bf16")
    plan_cmd = commands.add_parser("plan", help="per-GPU memory of a training run from the model's config.json "
                                                "alone, whether it fits, and else the smallest change that fits")
    plan_cmd.add_argument("config", metavar="CONFIG", help="a recipe YAML")
    plan_cmd.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides (right after CONFIG)")
    plan_cmd.add_argument("--gpus", type=int, required=True, help="GPUs, one torchrun rank each")
    plan_cmd.add_argument("--gpu-memory-gb", type=positive(float), default=80.0, help="memory of each GPU in GiB")
    plan_cmd.add_argument("--seq-len", type=positive(int),
                          help="tokens per row (default: estimated, see horizonrl.plan)")
    plan_cmd.add_argument("--json", action="store_true", help="print one JSON object (bytes)")
    export_cmd = commands.add_parser("export", help="write a run's last checkpoint as a Hugging Face model folder "
                                                    "(actor with adapters merged, tokenizer, adapter/, critic/)")
    export_cmd.add_argument("target", metavar="RUN_OR_CHECKPOINT",
                            help="a run folder (its last complete checkpoint) or RUN/checkpoints/iter_NNNNNN")
    export_cmd.add_argument("--to", required=True, type=Path, dest="out", metavar="DIR", help="the new model folder")
    gateway_cmd = commands.add_parser("gateway", help="serve a model over the OpenAI API (chat, completions), "
                                                      "recording the exact tokens of every call")
    gateway_cmd.add_argument("model", metavar="MODEL", help="a hub id, a model folder, builtin:NAME or a .gguf file")
    gateway_cmd.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    gateway_cmd.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this machine only)")
    gateway_cmd.add_argument("--port", type=int, default=8000)
    gateway_cmd.add_argument("--api-key", default=os.environ.get("HORIZONRL_API_KEY"),
                             help="required as Authorization: Bearer KEY (default: $HORIZONRL_API_KEY; none: open)")
    gateway_cmd.add_argument("--traces", type=Path, metavar="FILE", help="append every call as a JSON line to FILE")
    gateway_cmd.add_argument("--device", default="auto")
    gateway_cmd.add_argument("--seed", type=int, default=0, help="seeds the engine's sampler")
    gateway_cmd.add_argument("--max-tokens", type=int, default=1024, help="the most tokens one response may ask for")
    gateway_cmd.add_argument("--max-n", type=int, default=8, help="the most choices one request may ask for")
    gateway_cmd.add_argument("--max-model-len", type=int,
                             help="prompt + response tokens (default: the model's max_position_embeddings)")
    gateway_cmd.add_argument("--threads", type=threads, default="auto",
                             help="torch's CPU threads (default auto: half of the cores but one, the agents "
                                  "that call it having the other half; on a GPU torch's own)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("horizonrl").setLevel(logging.INFO)   # ours at INFO; libraries' (an agent's HTTP client) quiet
    if args.command in ("train", "sft") and args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    if args.command in ("train", "sft"):
        from horizonrl.engines.retry import EngineError
        from horizonrl.learner.device import use_run_threads
        from horizonrl.rollout.failures import RolloutsFailed
        from horizonrl.train.checkpoint import CheckpointError, StoppedBeforeCheckpoint, TrainingStopped, resume_config
        from horizonrl.train.sync_check import EngineOutOfSync

        config_path = args.args[0] if args.args and "=" not in args.args[0] else None
        overrides = args.args[1:] if config_path else args.args
        try:
            if args.command == "train":
                from horizonrl.train.loop import train

                resume = Path(args.resume) if args.resume is not None else None
                cfg = resume_config(resume, args.args) if resume else load_config(config_path, overrides)
                use_run_threads(cfg, "train")
                run_dir = train(cfg, progress=not args.quiet, resume=resume)
            else:
                from horizonrl.train.sft import sft

                cfg = load_config(config_path, overrides)
                use_run_threads(cfg, "sft")
                run_dir = sft(cfg, progress=not args.quiet)
        except ConfigError as error:
            print(f"horizonrl: config error:\n{error}", file=sys.stderr)
            return 2
        except CheckpointError as error:
            print(f"horizonrl: cannot resume: {error}", file=sys.stderr)
            return 2
        # an engine call retried and still failing; every rollout of a batch failed; an engine off the learner's weights
        except (EngineError, RolloutsFailed, EngineOutOfSync) as error:
            print(f"horizonrl: {error}", file=sys.stderr)
            return 1
        except (TrainingStopped, StoppedBeforeCheckpoint) as stopped:   # a signal: the run stopped (and saved)
            print(f"horizonrl: {stopped}", file=sys.stderr)
            return 128 + stopped.signum
        print(f"run folder: {run_dir}")
    elif args.command == "envs":
        from horizonrl.play import list_envs

        print(list_envs())
    elif args.command == "play":
        import yaml

        from horizonrl.play import play

        pairs = [arg.partition("=") for arg in args.kwargs]
        if any(not sep for _, sep, _ in pairs):
            print("horizonrl: play takes env arguments as key=value", file=sys.stderr)
            return 2
        try:
            play(args.env_id, {key: yaml.safe_load(value) for key, _, value in pairs}, args.seed, args.memory)
        except ValueError as error:   # unknown env, bad kwargs, missing package
            print(f"horizonrl: {error}", file=sys.stderr)
            return 2
    elif args.command == "view":
        from horizonrl.report.html import write_report

        if not (Path(args.run) / "config.yaml").is_file():
            print(f"horizonrl: {args.run} is not a run folder (no config.yaml)", file=sys.stderr)
            return 2
        print(write_report(Path(args.run)))
    elif args.command == "eval":
        from horizonrl.evaluate import MODES, evaluate, format_table
        from horizonrl.learner.device import resolve_device, use_threads

        try:
            use_threads(args.threads, resolve_device("auto").type)
            results, path = evaluate(args.target, args.episodes, args.env_ids, args.max_steps, args.seed,
                                     MODES if args.mode == "both" else (args.mode,), args.engine_settings)
        except ValueError as error:   # not a run or checkpoint, bad env or config, seeds used in training
            print(f"horizonrl: {error}", file=sys.stderr)
            return 2
        except EngineError as error:  # the engine's server is down or cannot do what eval needs
            print(f"horizonrl: {error}", file=sys.stderr)
            return 1
        print(format_table(results))
        print(f"results: {path}")
    elif args.command == "plan":
        import dataclasses
        import json

        from horizonrl.plan import format_plan, plan

        try:
            cfg = load_config(args.config, args.overrides, runs_here=False)   # vLLM need not be installed here
            result = plan(cfg, args.gpus, args.gpu_memory_gb, args.seq_len, args.config)
        except ValueError as error:   # a config error (ConfigError), a model the planner does not know
            print(f"horizonrl: {error}", file=sys.stderr)
            return 2
        print(json.dumps(dataclasses.asdict(result)) if args.json else format_plan(result))
    elif args.command == "export":
        from horizonrl.train.export import export

        try:
            print(export(Path(args.target), args.out))
        except (ValueError, FileExistsError) as error:   # not a run or checkpoint, none saved, DIR not empty
            print(f"horizonrl: {error}", file=sys.stderr)
            return 2
    elif args.command == "gateway":
        from horizonrl.gateway.server import serve
        from horizonrl.learner.device import resolve_device, use_threads

        try:
            use_threads(args.threads, resolve_device(args.device).type, 2,
                        "the gateway and the agents that call it")
            serve(args.model, args.engine, args.host, args.port, args.api_key or None, args.traces, args.device,
                  args.seed, args.max_tokens, args.max_n, args.max_model_len)
        except ValueError as error:   # a model that does not load (ConfigError), no such device
            print(f"horizonrl: {error}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
