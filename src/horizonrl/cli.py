"""horizonrl command line.

    horizonrl train [CONFIG] [key=value ...]    train (no CONFIG: the default recipe, configs/toy.yaml)
"""

from __future__ import annotations

import argparse
import logging
import sys

from horizonrl.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="horizonrl", description="Multi-turn RL for LLM agents.")
    commands = parser.add_subparsers(dest="command", required=True)
    train_cmd = commands.add_parser("train", help="train an agent with PPO")
    train_cmd.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]",
                           help="a recipe YAML (default configs/toy.yaml) and dotted overrides, e.g. ppo.actor_lr=1e-5")
    train_cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "train" and args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    if args.command == "train":
        config_path = args.args[0] if args.args and "=" not in args.args[0] else None
        overrides = args.args[1:] if config_path else args.args
        try:
            cfg = load_config(config_path, overrides)
            from horizonrl.train.loop import train

            run_dir = train(cfg, progress=not args.quiet)
        except ConfigError as error:
            print(f"horizonrl: config error:\n{error}", file=sys.stderr)
            return 2
        print(f"run folder: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
