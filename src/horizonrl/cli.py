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

Each subcommand is a parser function (`*_parser`) and a run function (`run_*`, returning the exit code). An error
that reaches `main` is one line on stderr, its exit code from one table (`exit_codes`, read by `report_error`): 2
for what the user can fix in the command (a config, a run folder), 1 for a run that failed, 128 + the signal for a
run a signal stopped. A command's `bad_input` adds the errors that mean bad input for it alone (a ValueError of
eval is a bad target or env; one raised inside training is a bug, and keeps its traceback).
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

from horizonrl import runfolder
from horizonrl.config import ConfigError, load_config, parse_threads

Command = Callable[[argparse.Namespace], int]


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


def exit_codes() -> list[tuple[type[BaseException], int, str]]:
    """(error type, exit code, what the line says before the message), the first that matches counting. Imported
    when an error has come: the run modules are heavy."""
    from horizonrl.engines.retry import EngineError
    from horizonrl.rollout.failures import RolloutsFailed
    from horizonrl.runstate.checkpoint import CheckpointError, StoppedBeforeCheckpoint, TrainingStopped
    from horizonrl.assembly.sync_check import EngineOutOfSync

    return [(ConfigError, 2, "config error:\n"),
            (CheckpointError, 2, ""),             # no run folder or checkpoint to resume or export
            (EngineError, 1, ""),                 # an engine call retried and still failing
            (RolloutsFailed, 1, ""),              # every rollout of a batch failed
            (EngineOutOfSync, 1, ""),             # the engine samples other weights than the learner's
            (TrainingStopped, 128, ""),           # a signal stopped the run (after a checkpoint)
            (StoppedBeforeCheckpoint, 128, "")]   # a signal stopped it before the first (nothing saved)


def report_error(error: BaseException, bad_input: tuple[type[BaseException], ...]) -> int | None:
    """Print `error`'s line and return its exit code (128: plus the number of the signal that stopped the run);
    None, printing nothing, when it is no error of the table nor `bad_input`."""
    for kind, code, prefix in [*exit_codes(), *((kind, 2, "") for kind in bad_input)]:
        if isinstance(error, kind):
            print(f"horizonrl: {prefix}{error}", file=sys.stderr)
            return code + getattr(error, "signum", 0) if code == 128 else code
    return None


def train_parser(commands) -> None:
    command = commands.add_parser("train", help="train an agent (PPO, a group algorithm or GiGPO)")
    command.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]",
                         help="a recipe YAML (default configs/babyai_tiny.yaml) and dotted overrides, e.g. "
                              "actor.lr=1e-5")
    command.add_argument("--resume", metavar="RUN", help="continue the run folder RUN from its last checkpoint, "
                                                         "with its config.yaml (only iterations, save_every and "
                                                         "budget.* can be changed)")
    command.add_argument("--quiet", action="store_true", help="no progress bar")
    command.set_defaults(run_command=run_train)


def sft_parser(commands) -> None:
    command = commands.add_parser("sft", help="supervised warm start from the env's expert demonstrations")
    command.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]",
                         help="a recipe YAML and dotted overrides, e.g. sft.episodes=512 (the sft: section)")
    command.add_argument("--quiet", action="store_true", help="no progress bar")
    command.set_defaults(run_command=run_sft)


def config_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """train's and sft's [CONFIG] [key=value ...]: a first argument without "=" is the recipe."""
    config_path = args.args[0] if args.args and "=" not in args.args[0] else None
    return config_path, args.args[1:] if config_path else args.args


def quiet_downloads(args: argparse.Namespace) -> None:
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def run_train(args: argparse.Namespace) -> int:
    from horizonrl.learner.device import use_run_threads
    from horizonrl.runstate.checkpoint import CheckpointError, resume_config
    from horizonrl.train.loop import train

    quiet_downloads(args)
    resume = Path(args.resume) if args.resume is not None else None
    try:
        cfg = resume_config(resume, args.args) if resume else load_config(*config_and_overrides(args))
        use_run_threads(cfg, "train")
        run_dir = train(cfg, progress=not args.quiet, resume=resume)
    except CheckpointError as error:      # only a resume reads a checkpoint before the run
        raise CheckpointError(f"cannot resume: {error}") from None
    print(f"run folder: {run_dir}")
    return 0


def run_sft(args: argparse.Namespace) -> int:
    from horizonrl.learner.device import use_run_threads
    from horizonrl.train.sft import sft

    quiet_downloads(args)
    cfg = load_config(*config_and_overrides(args))
    use_run_threads(cfg, "sft")
    print(f"run folder: {sft(cfg, progress=not args.quiet)}")
    return 0


def envs_parser(commands) -> None:
    commands.add_parser("envs", help="list every env id").set_defaults(run_command=run_envs)


def run_envs(args: argparse.Namespace) -> int:
    from horizonrl.play import list_envs

    print(list_envs())
    return 0


def play_parser(commands) -> None:
    command = commands.add_parser("play", help="play an env in the terminal, shown the agent's exact prompt")
    command.add_argument("env_id")
    command.add_argument("kwargs", nargs="*", metavar="key=value", help="env constructor arguments")
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--memory", type=int, default=1, help="past turns shown in the prompt")
    # unknown env, bad kwargs, missing package
    command.set_defaults(run_command=run_play, bad_input=(ValueError,))


def run_play(args: argparse.Namespace) -> int:
    import yaml

    from horizonrl.play import play

    pairs = [arg.partition("=") for arg in args.kwargs]
    if any(not sep for _, sep, _ in pairs):
        print("horizonrl: play takes env arguments as key=value", file=sys.stderr)
        return 2
    play(args.env_id, {key: yaml.safe_load(value) for key, _, value in pairs}, args.seed, args.memory)
    return 0


def view_parser(commands) -> None:
    command = commands.add_parser("view", help="(re)write a run folder's report.html and print its path")
    command.add_argument("run", metavar="RUN", help="a run folder, runs/<name>-<time>")
    command.set_defaults(run_command=run_view)


def run_view(args: argparse.Namespace) -> int:
    from horizonrl.report.html import write_report

    if not (Path(args.run) / runfolder.CONFIG).is_file():
        print(f"horizonrl: {args.run} is not a run folder (no config.yaml)", file=sys.stderr)
        return 2
    print(write_report(Path(args.run)))
    return 0


def eval_parser(commands) -> None:
    command = commands.add_parser("eval", help="play whole episodes on held-out seeds, greedy and sampled, and "
                                               "report success, length, return, valid actions and failure types")
    command.add_argument("target", metavar="RUN_OR_CHECKPOINT",
                         help="a run folder (its checkpoint/), RUN/init, RUN/checkpoint, any checkpoint folder, "
                              "builtin:NAME or a .gguf file")
    command.add_argument("--episodes", type=int, default=64, help="episodes per env and mode")
    command.add_argument("--env", nargs="+", dest="env_ids", metavar="ID", help="env ids (default: the run's env)")
    command.add_argument("--max-steps", type=int, help="turns after which an episode is cut (default: the env's)")
    command.add_argument("--seed", type=int, default=0, help="seeds the sampler of the sampled mode")
    command.add_argument("--mode", choices=["greedy", "sampled", "both"], default="both")
    command.add_argument("--opponent", metavar="SPEC",
                         help="an OpenSpiel game's opponent (random, mcts:N, perfect, checkpoint:PATH: a model "
                              "folder with the policy's tokenizer, or server:URL: the /v1 URL of an OpenAI-compatible "
                              "server returning token ids whose model has that tokenizer), each seat played apart")
    command.add_argument("--policy-table", type=Path, metavar="FILE",
                         help="write the policy over every information state of the run's OpenSpiel poker game as JSON "
                              "(its exploitability is in the results)")
    command.add_argument("--threads", type=threads, default="auto",
                         help="torch's CPU threads (default auto: the cores but one; on a GPU torch's own)")
    command.add_argument("engine_settings", nargs="*", metavar="key=value",
                         help="the engine that samples (right after the target): rollout.engine=hf|vllm|openai, "
                              "rollout.vllm.*, rollout.openai.*, precision=auto|fp32|bf16")
    # not a run or checkpoint, bad env or config, seeds used in training
    command.set_defaults(run_command=run_eval, bad_input=(ValueError,))


def run_eval(args: argparse.Namespace) -> int:
    from horizonrl.evaluate import MODES, evaluate, format_table
    from horizonrl.learner.device import resolve_device, use_threads

    use_threads(args.threads, resolve_device("auto").type)
    results, path = evaluate(args.target, args.episodes, args.env_ids, args.max_steps, args.seed,
                             MODES if args.mode == "both" else (args.mode,), args.engine_settings, args.policy_table,
                             args.opponent)
    print(format_table(results))
    print(f"results: {path}")
    return 0


def plan_parser(commands) -> None:
    command = commands.add_parser("plan", help="per-GPU memory of a training run from the model's config.json "
                                               "alone, whether it fits, and else the smallest change that fits")
    command.add_argument("config", metavar="CONFIG", help="a recipe YAML")
    command.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides (right after CONFIG)")
    command.add_argument("--gpus", type=int, required=True, help="GPUs, one torchrun rank each")
    command.add_argument("--gpu-memory-gb", type=positive(float), default=80.0, help="memory of each GPU in GiB")
    command.add_argument("--seq-len", type=positive(int),
                         help="tokens per row (default: estimated, see horizonrl.plan)")
    command.add_argument("--json", action="store_true", help="print one JSON object (bytes)")
    command.set_defaults(run_command=run_plan, bad_input=(ValueError,))    # a model the planner does not know


def run_plan(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from horizonrl.plan import format_plan, plan

    cfg = load_config(args.config, args.overrides, runs_here=False)   # vLLM need not be installed here
    result = plan(cfg, args.gpus, args.gpu_memory_gb, args.seq_len, args.config)
    print(json.dumps(dataclasses.asdict(result)) if args.json else format_plan(result))
    return 0


def export_parser(commands) -> None:
    command = commands.add_parser("export", help="write a run's last checkpoint as a Hugging Face model folder "
                                                 "(actor with adapters merged, tokenizer, adapter/, critic/)")
    command.add_argument("target", metavar="RUN_OR_CHECKPOINT",
                         help="a run folder (its last complete checkpoint) or RUN/checkpoints/iter_NNNNNN")
    command.add_argument("--to", required=True, type=Path, dest="out", metavar="DIR", help="the new model folder")
    # not a run or checkpoint, none saved, DIR not empty
    command.set_defaults(run_command=run_export, bad_input=(ValueError, FileExistsError))


def run_export(args: argparse.Namespace) -> int:
    from horizonrl.runstate.export import export

    print(export(Path(args.target), args.out))
    return 0


def gateway_parser(commands) -> None:
    command = commands.add_parser("gateway", help="serve a model over the OpenAI API (chat, completions), "
                                                  "recording the exact tokens of every call")
    command.add_argument("model", metavar="MODEL", help="a hub id, a model folder, builtin:NAME or a .gguf file")
    command.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    command.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this machine only)")
    command.add_argument("--port", type=int, default=8000)
    command.add_argument("--api-key", default=os.environ.get("HORIZONRL_API_KEY"),
                         help="required as Authorization: Bearer KEY (default: $HORIZONRL_API_KEY; none: open)")
    command.add_argument("--traces", type=Path, metavar="FILE", help="append every call as a JSON line to FILE")
    command.add_argument("--device", default="auto")
    command.add_argument("--seed", type=int, default=0, help="seeds the engine's sampler")
    command.add_argument("--max-tokens", type=int, default=1024, help="the most tokens one response may ask for")
    command.add_argument("--max-n", type=int, default=8, help="the most choices one request may ask for")
    command.add_argument("--max-model-len", type=int,
                         help="prompt + response tokens (default: the model's max_position_embeddings)")
    command.add_argument("--threads", type=threads, default="auto",
                         help="torch's CPU threads (default auto: half of the cores but one, the agents "
                              "that call it having the other half; on a GPU torch's own)")
    # a model that does not load, no such device
    command.set_defaults(run_command=run_gateway, bad_input=(ValueError,))


def run_gateway(args: argparse.Namespace) -> int:
    from horizonrl.gateway.server import serve
    from horizonrl.learner.device import resolve_device, use_threads

    use_threads(args.threads, resolve_device(args.device).type, 2, "the gateway and the agents that call it")
    serve(args.model, args.engine, args.host, args.port, args.api_key or None, args.traces, args.device,
          args.seed, args.max_tokens, args.max_n, args.max_model_len)
    return 0


SUBCOMMANDS = [train_parser, sft_parser, envs_parser, play_parser, view_parser, eval_parser, plan_parser,
               export_parser, gateway_parser]


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(prog="horizonrl", description="Multi-turn RL for LLM agents.")
    main_parser.set_defaults(bad_input=())
    commands = main_parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(commands)
    return main_parser


@record   # under torchrun: a rank's uncaught exception reaches torchrun's failure summary, naming the rank
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("horizonrl").setLevel(logging.INFO)   # ours at INFO; libraries' (an agent's HTTP client) quiet
    run: Command = args.run_command
    try:
        return run(args)
    except Exception as error:
        code = report_error(error, args.bad_input)
        if code is None:
            raise
        return code


if __name__ == "__main__":
    sys.exit(main())
