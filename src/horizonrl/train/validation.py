"""Validation: which policy a run keeps (config `validation`; off when null).

Every `validation.every` iterations (iteration 0 included: the policy the run starts from) and after the
run's last iteration, the policy plays `validation.episodes` greedy episodes of each env id on the
validation seeds (rollout/seeds.py: apart from every training seed and from the held-out seeds `horizonrl
eval` plays). For a poker game OpenSpiel scores exactly (policy_table.py: Kuhn, Leduc) it also measures the
policy's exploitability from its own probabilities at every information state. The policy with the best
score so far (a tie goes to the later iteration, trained longer) is saved as RUN/best/, a model folder like
RUN/checkpoint/; `horizonrl eval RUN` evaluates it. The score is minus the mean exploitability where there is
one (a game's success rate says little of a strategy: in self-play it is the first seat's wins), else the mean
success over the env ids. Each validation appends a line to RUN/validation.jsonl: the iteration, each env id's
success rate and failure types (report/diagnostics.py), their mean, each scored game's exploitability, the
score, and whether it is the new best; the report plots them. That file is also what a resumed run continues
from.

Why: the greedy policy of a run's last iteration is one draw from a policy that still moves. On the default
job (entropy bonus 0.01), seed 1 ended at held-out greedy goto 0.531 and pickup 0.422 where the policy its
validation kept scored 0.938 and 0.969 (BENCHMARKS.md, Default job). Selecting on seeds apart from the held-out
ones keeps the held-out evaluation an honest estimate.

The policy plays through an hf engine of its own over the learner's actor, apart from the rollout engine and
greedy (no random stream), so a validation changes neither what the rollouts sample nor the rollout engine's
state: the run trains exactly as it would without validation.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from horizonrl import runfolder
from horizonrl.config import TrainConfig
from horizonrl.evaluate import play_envs, plays_of, scored_games, scored_policy
from horizonrl.rollout.from_config import make_agent, make_engine, sampling_params
from horizonrl.rollout.seeds import validation_seeds
from horizonrl.runstate.checkpoint import save_checkpoint

log = logging.getLogger(__name__)


class Validation:
    """The validations of one run (`cfg.validation` set; one process): `due(i, last)` says whether iteration
    i ends with one, `run(...)` plays it, logs it and keeps the best policy."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, first_iteration: int):
        """A resumed run (`first_iteration` > 0) continues from the validations its file holds before that
        iteration; a later line (written after the checkpoint it resumes from) is dropped."""
        self.cfg, self.run_dir, self.seeds = cfg, run_dir, validation_seeds(cfg.validation.episodes)
        path = run_dir / runfolder.VALIDATIONS
        kept = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        kept = [line for line in kept if line["iteration"] < first_iteration]
        path.write_text("".join(json.dumps(line) + "\n" for line in kept))
        self.best = max((line.get("score", line["success_rate"]) for line in kept), default=None)   # older: success

    def due(self, iteration: int, last: bool) -> bool:
        return last or iteration % self.cfg.validation.every == 0

    def run(self, iteration: int, actor, tokenizer, device) -> dict:
        """Play the validation episodes with `actor` (greedy), append the line to validation.jsonl and, when
        it is the best so far, save `actor` as RUN/best/; returns the line."""
        cfg = self.cfg
        agent = make_agent(tokenizer, cfg.agent)
        greedy = {"greedy": sampling_params(cfg.rollout, tokenizer, actor, agent, temperature=0.0)}
        hf = cfg.rollout.model_copy(update={"engine": "hf"})
        with contextlib.closing(make_engine(actor, tokenizer, hf, cfg.seed, device)) as engine:
            played = play_envs(cfg, plays_of(cfg, cfg.env.ids), agent, engine, greedy, self.seeds)["greedy"]
        envs_results = {env_id: {"success_rate": summary["success_rate"], "failures": summary["failures"]}
                        for env_id, summary in played.items()}
        success = sum(r["success_rate"] or 0.0 for r in envs_results.values()) / len(envs_results)
        scored = {game: scored_policy(actor, tokenizer, agent, cfg, game, None)["exploitability"]
                  for game in scored_games(cfg.env.ids, None)}
        exploitability = {game: value for game, value in scored.items() if value is not None}
        score = -sum(exploitability.values()) / len(exploitability) if exploitability else success
        line = {"iteration": iteration, "success_rate": success, "envs": envs_results,
                "exploitability": exploitability, "score": score, "best": self.best is None or score >= self.best}
        if line["best"]:
            self.best = score
            save_checkpoint(self.run_dir / runfolder.BEST, actor, tokenizer)
        with (self.run_dir / runfolder.VALIDATIONS).open("a") as out:
            out.write(json.dumps(line) + "\n")
        log.info("validation at iteration %d: greedy success %.3f (%s)%s%s", iteration, success,
                 ", ".join(f"{env_id} {r['success_rate']}" for env_id, r in envs_results.items()),
                 "".join(f", {game} exploitability {value:.4f}" for game, value in exploitability.items()),
                 ", the best so far: saved as best/" if line["best"] else "")
        return line
