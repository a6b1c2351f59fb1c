"""`horizonrl sft`: a supervised warm start from expert demonstrations.

    build the policy (as `train` does)  ->  each env's expert plays `sft.episodes` episodes through the
    agent's exact prompts  ->  cross-entropy on the expert's response tokens only  ->  runs/<name>/checkpoint

No demonstration is one error naming its cause, which the CLI prints without a traceback: an env id with no
expert (a ConfigError naming env.id), or expert episodes that all failed before their first turn
(RolloutsFailed, naming the env ids, sft.episodes and the env errors).

With `optim.shared_prefix` the rows of a step that share a prefix compute it once (learner/shared_prefix.py), and
the demonstrations' record gives `perf/shared_prefix_share`.

The checkpoint loads back as `model.path=runs/<name>-<time>/checkpoint` for `train` and `eval`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from horizonrl import runfolder
from horizonrl.config import TrainConfig
from horizonrl.learner.device import precision, resolve_device
from horizonrl.learner.lora import lm_body
from horizonrl.learner.models import pad_token_id
from horizonrl.learner.sft import supervised_finetune
from horizonrl.learner.shared_prefix import prefix_sharing
from horizonrl.report.metrics import episode_metrics
from horizonrl.report.sinks import MetricsSinks, check_sinks
from horizonrl.rollout.failures import raise_if_none_succeeded
from horizonrl.rollout.from_config import make_agent
from horizonrl.runstate.checkpoint import save_checkpoint
from horizonrl.assembly.context import build_policy, make_run_dir
from horizonrl.train.demonstrations import demonstration_rows, expert_episodes

log = logging.getLogger(__name__)


def sft(cfg: TrainConfig, progress: bool = True) -> Path:
    """Run the supervised warm start; returns the run folder (checkpoint/, metrics.jsonl, config.yaml).
    `progress`: a progress bar over its `sft.steps` optimizer steps, with the loss (the CLI's --quiet: none)."""
    check_sinks(cfg.report_to)
    torch.manual_seed(cfg.seed)
    with precision(cfg.precision):
        device = resolve_device(cfg.device)
        tokenizer, policy = build_policy(cfg, device)
        agent = make_agent(tokenizer, cfg.agent)
        demos = [episode for env_id in cfg.env.ids for episode in
                 expert_episodes(agent, env_id, cfg.env.kwargs, cfg.sft.episodes, cfg.sft.max_turns, cfg.seed,
                                 cfg.sft.expert_noise)]
        raise_if_none_succeeded(sum(1 for episode in demos if episode.turns), len(demos),
                                [episode.metrics["error"] for episode in demos if "error" in episode.metrics],
                                f"expert episode of env.id {', '.join(cfg.env.ids)} (sft.episodes={cfg.sft.episodes} "
                                "each)", "sft has no demonstration to learn from; nothing was saved")
        demo_metrics = episode_metrics(demos)
        demo_metrics["sft/deviations"] = sum(turn.info.get("deviation", False) for e in demos for turn in e.turns)
        log.info("%d expert episodes, %d turns (%d of them random deviations, not learned from), success rate "
                 "%.3f", len(demos), demo_metrics["env/turns"], demo_metrics["sft/deviations"],
                 demo_metrics["env/success_rate"])
        sharing = prefix_sharing(lm_body(policy)) if cfg.optim.shared_prefix else None
        losses = supervised_finetune(policy, demonstration_rows(demos), pad_token_id(tokenizer), cfg.sft.steps,
                                     cfg.sft.batch_size, cfg.sft.lr, seed=cfg.seed,
                                     lr_decay=cfg.sft.lr_decay, progress=progress, desc=cfg.name, sharing=sharing)
    shared = {}
    if sharing is not None:
        tokens, skipped = sharing.taken()
        shared = {"perf/shared_prefix_share": skipped / max(tokens, 1)}
        log.info("shared prefixes: %.0f%% of the %d row tokens computed once for several rows",
                 100 * shared["perf/shared_prefix_share"], tokens)
    run_dir = make_run_dir(cfg)
    with MetricsSinks(run_dir, cfg.report_to, cfg.model_dump(mode="json")) as metrics:
        metrics.write({"iteration": 0, "phase": "demonstrations", **demo_metrics, **shared})
        for step, loss in enumerate(losses, 1):
            metrics.write({"iteration": step, "phase": "sft", "sft/loss": loss})
    save_checkpoint(run_dir / runfolder.CHECKPOINT, policy, tokenizer)
    return run_dir
