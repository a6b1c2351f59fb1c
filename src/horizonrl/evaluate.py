"""`horizonrl eval RUN_OR_CHECKPOINT`: whole episodes on held-out seeds, greedy and sampled, with
Verlog's diagnostics per env (success rate, episode length and return, valid-action ratio, failure
types: report/diagnostics.py).

What is evaluated, and with which settings:
- a run folder (config.yaml + checkpoint/): the policy the run kept: best/ when its validation chose one
  (train/validation.py), else its final checkpoint/;
- a folder in a run (RUN/checkpoint, RUN/init): that checkpoint. RUN/init is the run's initial policy:
  the warm-started tiny model the run saved there, or, for a run that loaded `model.path`, that model;
- with a run, its config.yaml gives the env (id and kwargs; `--env` may name others, built with their
  defaults), the agent (memory window, history, feedback, invalid penalty, translations), the rollout
  (max_tokens, temperature, top_p, batch size), env workers and the device, so a run's init and
  checkpoint are evaluated on equal terms;
- any other checkpoint folder (model + tokenizer in Hugging Face format, as runstate/checkpoint.py saves
  them): the config defaults, and `--env` is required.
- a model name (`builtin:NAME`, a .gguf file: its converted folder, learner/gguf.py): the config defaults,
  and `--env` is required.
Modes: greedy (temperature 0) and sampled (the run's temperature, the sampler seeded with `--seed`).
Episodes: the first N held-out seeds (rollout/seeds.py), the same for every checkpoint; an episode
ends when the env ends it, or after `--max-steps` turns (then it counts as truncated).
The results go to eval-<checkpoint folder name>.json beside the checkpoint folder (RUN/eval-checkpoint.json,
RUN/eval-init.json); for a model name, in runs/.
For an OpenSpiel game whose exploitability is computed exactly (policy_table.py: Kuhn and Leduc poker), the
results' "games" give the policy's exploitability and the table's coverage, and `policy_table` (`--policy-table
FILE`) writes the table; with `agent.memory` above 0 the play's prompts hold history the table's do not, and the
game says so instead of a number.
`--opponent SPEC` plays an OpenSpiel game's seats apart against an opponent: the env's own (random, mcts:N,
perfect: envs/opponents.py), or a model: `checkpoint:PATH`, a model folder's policy on an engine of its own, or
`server:URL`, the model an OpenAI-compatible server serves at URL (its /v1), the game in self-play mode with the
evaluated policy in one seat (rollout/seat_opponents.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from horizonrl import runfolder
from horizonrl.config import TrainConfig, apply_overrides, load_config, validate
from horizonrl.engines.base import SamplingParams
from horizonrl.envs import check_kwargs
from horizonrl.envs.two_player import SELF_PLAY
from horizonrl.envs.pool import open_envs
from horizonrl.learner.device import precision, resolve_device
from horizonrl.learner.models import BUILTIN, load_policy, resolve_model_path
from horizonrl.policy_table import exploitability, policy_table, scored_game
from horizonrl.report.diagnostics import FAILURE_TYPES, episode_summary, game_outcomes
from horizonrl.rollout.episode_groups import play_seeds
from horizonrl.rollout.from_config import make_agent, make_engine, model_opponent, sampling_params, served_opponent
from horizonrl.rollout.seat_opponents import CHECKPOINT, NO_OPPONENT, SERVER, SeatOpponent
from horizonrl.rollout.seeds import HELD_OUT_START, SEED_BLOCK, held_out_seeds, max_training_episodes

log = logging.getLogger(__name__)
MODES = ("greedy", "sampled")
ENGINE_KEYS = ("rollout.engine=", "rollout.vllm.", "rollout.openai.", "precision=")


def resolve_target(target: str | Path) -> tuple[Path, Path | None]:
    """(checkpoint folder, the run's config.yaml or None); a run folder stands for its best/ (kept by its
    validation) or else its checkpoint/, a model name (`builtin:NAME`, a .gguf file) for its folder
    (learner/models.resolve_model_path)."""
    if is_model_name(target):
        return Path(resolve_model_path(str(target))), None
    checkpoint = Path(target).resolve()
    if (checkpoint / runfolder.CONFIG).is_file():
        best = checkpoint / runfolder.BEST
        checkpoint = best if (best / "config.json").is_file() else checkpoint / runfolder.CHECKPOINT
    run_config = checkpoint.parent / runfolder.CONFIG
    return checkpoint, run_config if run_config.is_file() else None


def is_model_name(target: str | Path) -> bool:
    """Whether `target` names a model rather than a folder: `builtin:NAME` or a .gguf file."""
    return str(target).startswith(BUILTIN) or str(target).lower().endswith(".gguf")


def model_to_load(checkpoint: Path, cfg: TrainConfig, run_config: Path | None) -> str:
    """The checkpoint folder; for RUN/init of a run that loaded `model.path` (it saves no init/), that model."""
    if (checkpoint / "config.json").is_file():
        return str(checkpoint)
    if checkpoint.name == runfolder.INIT and run_config is not None and cfg.model.path is not None:
        return cfg.model.path
    if not checkpoint.is_dir():
        raise ValueError(f"{checkpoint}: no such folder")
    raise ValueError(f"{checkpoint}: not a checkpoint folder (no config.json) nor a run folder (no config.yaml)")


def evaluate(target: str | Path, episodes: int = 64, env_ids: list[str] | None = None, max_steps: int | None = None,
             seed: int = 0, modes: tuple[str, ...] = MODES, engine_settings: list[str] = (),
             table_path: Path | None = None, opponent: str | None = None) -> tuple[dict, Path]:
    """Play `episodes` held-out episodes per env and mode; returns the results and the JSON file
    they were written to. `engine_settings`: key=value overrides of the engine that samples (ENGINE_KEYS).
    `table_path`: where the policy table of the one scored game (module docstring) goes. `opponent`: an OpenSpiel
    game's opponent for this evaluation (envs/opponents.py, or checkpoint:PATH), each seat played apart
    (`seat_plays`)."""
    checkpoint, run_config = resolve_target(target)
    for setting in engine_settings:
        if not setting.startswith(ENGINE_KEYS):
            raise ValueError(f"eval takes engine settings only ({', '.join(ENGINE_KEYS)}...), got {setting!r}")
    cfg = load_config(run_config, engine_settings, run_folder=True) if run_config is not None else \
        validate(apply_overrides({}, engine_settings))
    model_path = model_to_load(checkpoint, cfg, run_config)
    env_ids = check_evaluable(cfg, run_config, env_ids, max_steps)
    plays = plays_of(cfg, env_ids) if opponent is None else seat_plays(cfg, env_ids, opponent)
    games = scored_games(env_ids, table_path)
    seeds = held_out_seeds(episodes)
    device = resolve_device(cfg.device)
    tokenizer, model = load_policy(model_path, device)
    agent = make_agent(tokenizer, cfg.agent)
    temperatures = {"greedy": 0.0, "sampled": cfg.rollout.temperature}
    results = results_header(cfg, model_path, run_config, seeds, max_steps, seed, temperatures, modes)
    params = {mode: sampling_params(cfg.rollout, tokenizer, model, agent, temperatures[mode]) for mode in modes}
    opponent_model = checkpoint_opponent(opponent, tokenizer, cfg, seed, device)
    # one engine for every env and mode: each request is seeded, so none depends on what came before;
    # built inside the precision block, which fixes its autocast
    with precision(cfg.precision), contextlib.closing(make_engine(model, tokenizer, cfg.rollout, seed,
                                                                device)) as engine:
        played = play_envs(cfg, plays, agent, engine, params, seeds, max_steps, opponent_model)
    for mode, by_env in played.items():
        for env_id, summary in by_env.items():
            results["modes"][mode]["envs"][env_id] = summary
            log.info("%s %s: %d episodes in %.1f s", mode, env_id, summary["episodes"], summary["seconds"])
    if games:
        results["games"] = {game: scored_policy(model, tokenizer, agent, cfg, game, table_path) for game in games}
    results_dir = Path(cfg.output_dir) if is_model_name(target) else checkpoint.parent
    results_dir.mkdir(parents=True, exist_ok=True)
    results_path = results_dir / f"eval-{checkpoint.name}.json"
    results_path.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    return results, results_path


def results_header(cfg: TrainConfig, model_path: str, run_config: Path | None, seeds: list[int],
                   max_steps: int | None, seed: int, temperatures: dict[str, float], modes: tuple[str, ...]) -> dict:
    """The results' settings, with an empty "envs" per mode for the plays to fill."""
    return {
        "checkpoint": model_path, "run_config": str(run_config) if run_config else None,
        "seeds": {"first": seeds[0], "last": seeds[-1], "count": len(seeds),
                  "rule": f"{HELD_OUT_START} + i; training seeds are r * {SEED_BLOCK} + j with j < {HELD_OUT_START} "
                          "(horizonrl.rollout.seeds)"},
        "max_steps": max_steps, "sampler_seed": seed, "agent": cfg.agent.model_dump(mode="json"),
        "max_tokens": cfg.rollout.max_tokens,
        "modes": {mode: {"temperature": temperatures[mode], "top_p": cfg.rollout.top_p if mode == "sampled" else None,
                         "envs": {}} for mode in modes},
    }


def checkpoint_opponent(opponent: str | None, tokenizer, cfg: TrainConfig, seed: int, device) -> SeatOpponent:
    """The model of `--opponent checkpoint:PATH` or `server:URL` (rollout/from_config.model_opponent,
    served_opponent); NO_OPPONENT for any other."""
    if opponent is not None and opponent.startswith(SERVER):
        return served_opponent(opponent.removeprefix(SERVER), tokenizer, cfg.rollout, seed)
    if opponent is None or not opponent.startswith(CHECKPOINT):
        return NO_OPPONENT
    return model_opponent(opponent.removeprefix(CHECKPOINT), tokenizer, cfg.rollout, seed, device)


def scored_games(env_ids: list[str], table_path: Path | None) -> list[str]:
    """The OpenSpiel games among `env_ids` whose exploitability is computed here; with `table_path`, there must be
    one (its table goes there), else a ValueError before any model is loaded."""
    games = [game for game in map(scored_game, env_ids) if game]
    if table_path is not None and len(games) != 1:
        raise ValueError(f"--policy-table writes the table of one game whose exploitability is computed here "
                         f"(openspiel:kuhn_poker, openspiel:leduc_poker); the envs evaluated hold {len(games)}")
    return games


def scored_policy(model, tokenizer, agent, cfg: TrainConfig, game: str, table_path: Path | None) -> dict:
    """The policy's exploitability in `game` and its table's coverage (policy_table.py); the table written to
    `table_path`. With agent.memory above 0, why there is no number."""
    if cfg.agent.memory > 0 or cfg.agent.history == "full":
        return {"exploitability": None, "why": f"agent.memory is {cfg.agent.memory} (history {cfg.agent.history}): "
                "a policy table prompts each information state from its observation alone; train with "
                "agent.memory=0 to score it"}
    started = time.perf_counter()
    table, coverage = policy_table(model, tokenizer, agent, game, cfg.rollout.temperature)
    if table_path is not None:
        table_path.write_text(json.dumps(table, indent=1) + "\n")
    return {"exploitability": exploitability(table), "coverage": coverage, "information_states": len(table["policy"]),
            "temperature": table["temperature"], "seconds": time.perf_counter() - started}


@dataclass(frozen=True)
class Play:
    """The episodes of one env to play: how the results name them, the env id and its kwargs; against a model
    opponent (checkpoint:PATH, server:URL), the seat the evaluated policy plays."""

    label: str
    env_id: str
    kwargs: dict
    learner_seat: int | None = None


def plays_of(cfg: TrainConfig, env_ids: list[str]) -> list[Play]:
    """One play per env id, with the run's env kwargs where it trained on that env."""
    return [Play(env_id, env_id, cfg.env.kwargs if env_id in cfg.env.ids else {}) for env_id in env_ids]


def seat_plays(cfg: TrainConfig, env_ids: list[str], opponent: str) -> list[Play]:
    """Each OpenSpiel game against `opponent` in each seat apart ("<env id> seat 0", "... seat 1"); ValueError when
    an env is not such a game or cannot have that opponent. A model opponent (checkpoint:PATH, server:URL) plays the
    game in self-play mode, the evaluated policy in the play's seat."""
    by_model = opponent.startswith((CHECKPOINT, SERVER))
    plays = []
    for play in plays_of(cfg, env_ids):
        if not play.env_id.startswith("openspiel:"):
            raise ValueError(f"--opponent plays OpenSpiel games (openspiel:<game>); {play.env_id} is not one")
        for seat in (0, 1):
            kwargs = {**play.kwargs, "opponent": SELF_PLAY if by_model else opponent, "seat": seat}
            check_kwargs(play.env_id, kwargs)
            plays.append(Play(f"{play.env_id} seat {seat}", play.env_id, kwargs, seat if by_model else None))
    return plays


def play_envs(cfg: TrainConfig, plays: list[Play], agent, engine, params: dict[str, SamplingParams],
              seeds: list[int], max_steps: int | None = None,
              opponent_model: SeatOpponent = NO_OPPONENT) -> dict[str, dict[str, dict]]:
    """Each play's episodes on `seeds` under each of `params` (a name -> sampling parameters), `agent` over
    `engine`: {name: {play label: episode_summary with its "seconds", and a game's "games" (`game_outcomes`)}}.
    `opponent_model` plays the other seat of the plays that name the policy's (`Play.learner_seat`).
    One pool of envs per play, closed after its episodes. `horizonrl eval` plays the held-out seeds with this,
    and a run's validation (train/validation.py) its validation seeds."""
    played = {name: {} for name in params}
    for play in plays:
        opponent = NO_OPPONENT if play.learner_seat is None else \
            SeatOpponent(opponent_model.name, opponent_model.engine, play.learner_seat)
        envs = open_envs(play.env_id, play.kwargs, min(len(seeds), cfg.rollout.n_env), cfg.env.workers,
                         cfg.env.timeout_s)
        try:
            for name, sampling in params.items():
                started = time.perf_counter()
                episodes = play_seeds(envs, play.env_id, agent, engine, sampling, seeds, max_steps, opponent)
                outcomes = game_outcomes(episodes)
                played[name][play.label] = {**episode_summary(episodes), **({"games": outcomes} if outcomes else {}),
                                            "seconds": time.perf_counter() - started}
        finally:
            for env in envs:
                env.close()
    return played


def check_evaluable(cfg: TrainConfig, run_config: Path | None, env_ids: list[str] | None,
                    max_steps: int | None) -> list[str]:
    """The env ids to play (`env_ids`, else the run's env ids); one clear error, before any model is
    loaded, for what cannot be evaluated as asked."""
    if run_config is None and not env_ids:
        raise ValueError("this checkpoint has no run config.yaml beside it: name the env(s) with --env")
    if cfg.task is not None:
        raise ValueError(f"{run_config}: the run trained on the task {cfg.task.source!r}; eval plays env episodes")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"--max-steps must be >= 1, got {max_steps}")
    if run_config is not None and max_training_episodes(cfg) > HELD_OUT_START:
        raise ValueError(f"{run_config}: the run may have started up to {max_training_episodes(cfg)} episodes per "
                         f"collector, so it may have trained on the held-out seeds (from {HELD_OUT_START})")
    env_ids = env_ids or cfg.env.ids
    for env_id in env_ids:
        check_kwargs(env_id, cfg.env.kwargs if env_id in cfg.env.ids else {})
    return env_ids


def format_table(results: dict) -> str:
    """One row per mode and env: success rate, mean length, mean return, valid-action ratio, the count
    of each failure type and of episodes lost to env errors; a line per scored game (its exploitability)."""
    header = ["mode", "env", "episodes", "success", "length", "return", "valid", *FAILURE_TYPES, "errors"]
    rows = [header]
    for mode, by_mode in results["modes"].items():
        for env_id, s in by_mode["envs"].items():
            rows.append([mode, env_id, str(s["episodes"]), _number(s["success_rate"], 3),
                         _number(s["episode_length"], 1), _number(s["episode_return"], 3),
                         _number(s["valid_action_ratio"], 3), *(str(s["failures"][k]) for k in FAILURE_TYPES),
                         str(s["errored_episodes"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    seeds = results["seeds"]
    lines = [f"{results['checkpoint']}: held-out seeds {seeds['first']}..{seeds['last']}"]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    for mode, by_mode in results["modes"].items():
        for label, s in by_mode["envs"].items():
            if "games" in s:
                g = s["games"]
                rate, low, high = g["win_rate"]
                lines.append(f"{mode} {label}: {g['win']} won, {g['draw']} drawn, {g['loss']} lost ({g['illegal']} by "
                             f"an illegal move) of {g['games']}; win rate {rate:.3f} [{low:.3f}, {high:.3f}]")
    for game, scored in results.get("games", {}).items():
        lines.append(f"{game}: " + (scored["why"] if scored["exploitability"] is None else
                     f"exploitability {scored['exploitability']:.4f} (OpenSpiel, {scored['information_states']} "
                     f"information states; the table covers {scored['coverage']:.3f} of the model's responses)"))
    return "\n".join(lines)


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
