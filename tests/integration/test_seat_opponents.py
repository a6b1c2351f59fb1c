"""Another policy in a seat of a self-play game (rollout/seat_opponents.py): a model or a pool of the policy's
snapshots plays seat 1 - seed % 2, its turns are no one's episode, and `horizonrl eval --opponent checkpoint:PATH`
plays each seat against a model folder."""

import json
import random

import pytest
import torch

pytest.importorskip("pyspiel", reason="the games extra is not installed: pip install -e '.[games]'")

from horizonrl import envs  # noqa: E402
from horizonrl.agents.agent import Agent  # noqa: E402
from horizonrl.agents.prompt import plan_text  # noqa: E402
from horizonrl.assembly.warm_start import build_tiny_for_envs  # noqa: E402
from horizonrl.cli import main  # noqa: E402
from horizonrl.config import SOURCE_CONFIGS, ConfigError, TinyModel, load_config  # noqa: E402
from horizonrl.engines.base import SamplingParams  # noqa: E402
from horizonrl.engines.hf import HFEngine  # noqa: E402
from horizonrl.engines.scripted import ScriptedEngine  # noqa: E402
from horizonrl.envs.pool import open_envs  # noqa: E402
from horizonrl.report.metrics import read_metrics  # noqa: E402
from horizonrl.rollout.episode_groups import EnvEpisodes  # noqa: E402
from horizonrl.rollout.groups import GroupCollector  # noqa: E402
from horizonrl.rollout.seat_opponents import OpponentPool, SeatOpponent  # noqa: E402

KUHN = "openspiel:kuhn_poker"
SELF_PLAY_KUHN = [f"env.id={KUHN}", "env.kwargs={opponent: self}", "agent.memory=0", "model.warm_start=null",
                  "algorithm=grpo", "group.n_tasks=2", "group.group_size=2", "rollout.n_env=4"]


def scripted(tokenizer, move: str) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, lambda prompt: plan_text("scripted", move))


def test_the_opponent_plays_the_other_seat_and_only_the_policys_seat_becomes_an_episode():
    """The policy always bets, the opponent always passes. Policy in seat 0: bet, the opponent passes (folds): +1.
    Policy in seat 1: the opponent passes, the policy bets, the opponent folds: +1. Two seeds (one of each
    parity) x 2 rollouts: four games, four episodes, each the policy's one turn."""
    tokenizer, _ = build_tiny_for_envs([envs.make(KUHN)], TinyModel(), seed=0, device="cpu")
    handles = open_envs(KUHN, {"opponent": "self"}, 2, False, 60.0)
    opponent = SeatOpponent("model:passer", scripted(tokenizer, "pass"))
    episodes = EnvEpisodes(handles, [KUHN], Agent(tokenizer, memory=0), scripted(tokenizer, "bet"),
                           SamplingParams(max_tokens=32), max_turns=None, opponent=opponent)
    played = GroupCollector(episodes, n_tasks=2, group_size=2, seed=0).collect()
    assert len(played) == 4 and {e.seed % 2 for e in played} == {0, 1}
    for episode in played:
        (turn,) = episode.turns
        assert turn.seat == episode.seed % 2 and turn.policy is None and turn.action == "bet"
        assert episode.group_id.endswith(f"/seat{episode.seed % 2}") and episode.outcome_reward == 1.0
        assert turn.info["metrics"] | {"first_seat_win": None} == {"win": 1.0, "draw": 0.0, "loss": 0.0,
                                                                    "illegal": 0.0, "first_seat_win": None}


def test_the_pool_snapshots_when_due_keeps_the_newest_and_puts_the_drawn_member_in_its_engine():
    """size 2, a snapshot every 2 iterations; snapshot k (k = 0 at the start) has every weight equal to k. The engine
    samples from `model` itself, so the drawn member's weights are `model`'s."""
    tokenizer, model = build_tiny_for_envs([envs.make(KUHN)], TinyModel(), seed=0, device="cpu")
    taken = []

    def snapshot():
        taken.append(len(taken))
        return {name: torch.full_like(value, float(taken[-1])) for name, value in model.state_dict().items()}
    pool = OpponentPool(HFEngine(model, 0), snapshot, size=2, snapshot_every=2, seed=0)
    drawn = []
    for iteration in range(1, 9):
        stats = pool.after_update(iteration)
        members = [name for name, _ in pool.members]
        assert members == {1: ["pool/iter0"], 2: ["pool/iter0", "pool/iter2"], 3: ["pool/iter0", "pool/iter2"],
                           4: ["pool/iter2", "pool/iter4"], 5: ["pool/iter2", "pool/iter4"],
                           6: ["pool/iter4", "pool/iter6"], 7: ["pool/iter4", "pool/iter6"],
                           8: ["pool/iter6", "pool/iter8"]}[iteration]
        assert pool.name == random.Random(f"pool 0 {iteration}").choice(members)
        value = int(pool.name.removeprefix("pool/iter")) // 2          # iter0: snapshot 0, iter2: 1, iter4: 2, ...
        assert all(torch.equal(p, torch.full_like(p, float(value))) for p in model.state_dict().values())
        assert stats == {"selfplay/pool_size": len(members),
                         "selfplay/opponent_iteration": float(pool.name.removeprefix("pool/iter"))}
        drawn.append(pool.name)
    assert len(set(drawn)) > 2                                   # not stuck on one member


@pytest.mark.parametrize("overrides, message", [
    (["selfplay.pool_size=2", f"env.id={KUHN}", "env.kwargs={opponent: random}", "algorithm=grpo"],
     "selfplay.pool_size: an opponent plays a seat of a game the policy would play every seat of; set "
     "env.kwargs.opponent=self (got 'random')"),
    (["selfplay.pool_size=2", "selfplay.opponent_model=x", *SELF_PLAY_KUHN],
     "selfplay.opponent_model: selfplay.opponent_model and selfplay.pool_size each choose the opponent and "
     "exclude each other"),
    (["selfplay.opponent_url=http://127.0.0.1:8000/v1", "selfplay.opponent_model=x", *SELF_PLAY_KUHN],
     "selfplay.opponent_model: selfplay.opponent_model and selfplay.opponent_url each choose the opponent"),
    (["selfplay.pool_size=2", f"env.id={KUHN}", "env.kwargs={opponent: self}"],
     "selfplay.pool_size: an opponent plays env episode groups"),
])
def test_an_opponent_where_none_can_play_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(str(SOURCE_CONFIGS / "toy.yaml"), overrides)


def test_a_pool_run_a_model_opponent_run_and_an_eval_against_a_checkpoint(tmp_path, capsys):
    pool_runs, model_runs = tmp_path / "pool", tmp_path / "model"
    assert main(["train", str(SOURCE_CONFIGS / "toy.yaml"), *SELF_PLAY_KUHN, "iterations=2", "selfplay.pool_size=2",
                 "selfplay.snapshot_every=1", f"output_dir={pool_runs}", "--quiet"]) == 0
    (pool_run,) = pool_runs.iterdir()
    records = read_metrics(pool_run / "metrics.jsonl")
    assert [r["selfplay/pool_size"] for r in records] == [2, 2]
    assert all(r["env/episodes"] == 2 * 2 for r in records)     # one seat of each game: the policy's
    assert all(r["env/win"] + r["env/draw"] + r["env/loss"] == pytest.approx(1.0) for r in records)
    init = pool_run / "init"
    assert main(["train", str(SOURCE_CONFIGS / "toy.yaml"), *SELF_PLAY_KUHN, "iterations=1", f"model.path={init}",
                 f"selfplay.opponent_model={init}", f"output_dir={model_runs}", "--quiet"]) == 0
    (model_run,) = model_runs.iterdir()
    (record,) = read_metrics(model_run / "metrics.jsonl")
    assert record["env/episodes"] == 4 and record["train/actor/skipped_updates"] == 0
    capsys.readouterr()
    assert main(["eval", str(model_run), "--episodes", "4", "--mode", "greedy",
                 "--opponent", f"checkpoint:{init}"]) == 0
    played = json.loads((model_run / "eval-checkpoint.json").read_text())["modes"]["greedy"]["envs"]
    assert list(played) == [f"{KUHN} seat 0", f"{KUHN} seat 1"]
    for summary in played.values():
        assert summary["episodes"] == 4 and summary["games"]["games"] == 4
        assert summary["games"]["win"] + summary["games"]["draw"] + summary["games"]["loss"] == 4
    capsys.readouterr()
    assert main(["eval", str(model_run), "--episodes", "2", "--opponent", f"checkpoint:{tmp_path / 'none'}"]) == 2
    assert f"the opponent model {tmp_path / 'none'} is no folder" in capsys.readouterr().err


def test_a_served_model_plays_the_other_seat_in_training_and_in_eval(tmp_path, capsys):
    """A gateway (a real OpenAI-compatible server returning token ids) serves the toy's initial policy; as the
    opponent it samples every turn of the other seat: a completion at least for each game, beside the engine's
    start-up probe."""
    from horizonrl.gateway.server import Gateway, GatewayThread
    from horizonrl.learner.models import load_policy, stop_ids

    first = tmp_path / "first"
    assert main(["train", str(SOURCE_CONFIGS / "toy.yaml"), *SELF_PLAY_KUHN, "iterations=1",
                 f"output_dir={first}", "--quiet"]) == 0
    (first_run,) = first.iterdir()
    tokenizer, model = load_policy(str(first_run / "init"), torch.device("cpu"))
    gateway = Gateway(HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer), tokenizer, "opponent", 2048,
                      stop_ids(tokenizer, model))
    thread = GatewayThread(gateway)
    url = f"{thread.start()}/v1"
    try:
        served = tmp_path / "served"
        assert main(["train", str(SOURCE_CONFIGS / "toy.yaml"), *SELF_PLAY_KUHN, "iterations=1",
                     f"model.path={first_run / 'init'}", f"selfplay.opponent_url={url}", f"output_dir={served}",
                     "--quiet"]) == 0
        (served_run,) = served.iterdir()
        (record,) = read_metrics(served_run / "metrics.jsonl")
        assert record["env/episodes"] == 4 and record["train/actor/skipped_updates"] == 0   # the policy's seats
        games = 4
        assert gateway.stats["requests"] >= 1 + games and gateway.stats["errors"] == 0    # a probe, then turns
        before = gateway.stats["requests"]
        capsys.readouterr()
        assert main(["eval", str(served_run), "--episodes", "4", "--mode", "greedy", "--opponent",
                     f"server:{url}"]) == 0
        played = json.loads((served_run / "eval-checkpoint.json").read_text())["modes"]["greedy"]["envs"]
        assert list(played) == [f"{KUHN} seat 0", f"{KUHN} seat 1"]
        assert all(summary["games"]["games"] == 4 for summary in played.values())
        assert gateway.stats["requests"] > before + 1
    finally:
        thread.stop()
    capsys.readouterr()
    assert main(["eval", str(served_run), "--episodes", "2", "--opponent", "server:http://127.0.0.1:9/v1"]) == 1
    assert "no answer from the OpenAI-compatible server at http://127.0.0.1:9/v1" in capsys.readouterr().err


def test_a_pool_run_resumed_goes_on_with_the_same_opponents(tmp_path):
    """3 iterations straight, and 2 then resumed to 3: a snapshot joins every iteration (size 2), so after the
    resume the pool must hold the checkpoint's members, not the restored policy alone; the weights end equal."""
    from safetensors.torch import load_file

    common = [str(SOURCE_CONFIGS / "toy.yaml"), *SELF_PLAY_KUHN, "selfplay.pool_size=2", "selfplay.snapshot_every=1",
              "save_every=0"]
    assert main(["train", *common, "iterations=3", f"output_dir={tmp_path / 'straight'}", "--quiet"]) == 0
    assert main(["train", *common, "iterations=2", f"output_dir={tmp_path / 'resumed'}", "--quiet"]) == 0
    (straight,), (resumed,) = (tmp_path / "straight").iterdir(), (tmp_path / "resumed").iterdir()
    assert main(["train", "--resume", str(resumed), "iterations=3", "--quiet"]) == 0
    ours, theirs = (load_file(run / "checkpoint" / "model.safetensors") for run in (resumed, straight))
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    assert [r["selfplay/opponent_iteration"] for r in read_metrics(resumed / "metrics.jsonl")] == \
        [r["selfplay/opponent_iteration"] for r in read_metrics(straight / "metrics.jsonl")]
