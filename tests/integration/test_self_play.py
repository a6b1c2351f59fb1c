"""Self-play: the policy plays every seat of an OpenSpiel game (`opponent: self`), and the collector makes one
episode per seat (rollout/seats.py), grouped by seed and seat."""

import pytest

pytest.importorskip("pyspiel", reason="the games extra is not installed: pip install -e '.[games]'")

from horizonrl import envs  # noqa: E402
from horizonrl.config import SOURCE_CONFIGS, ConfigError, load_config  # noqa: E402


def test_the_seat_to_move_changes_each_step_and_the_end_gives_every_seats_return():
    env = envs.make("openspiel:kuhn_poker", opponent="self")
    observation, _ = env.reset(4)
    assert env.seat == 0 and observation.startswith("You are player 1 of 2")
    observation, reward, terminated, _, _ = env.step("bet")
    assert (env.seat, reward, terminated) == (1, 0.0, False) and "the opponent bet" in observation
    _, reward, terminated, _, info = env.step("bet")          # called: the higher card takes the 2-chip pot
    assert (reward, terminated) == (0.0, True)
    assert sorted(info["seat_returns"]) == [-2.0, 2.0]
    assert info["metrics"]["first_seat_win"] == float(info["seat_returns"][0] > 0)


def test_an_illegal_move_in_self_play_costs_only_the_offender():
    env = envs.make("openspiel:tic_tac_toe", opponent="self")
    env.reset(0)
    env.step("b2")
    _, _, terminated, _, info = env.step("b2")                # seat 1 plays the taken cell
    assert terminated and info["seat_returns"] == [0.0, -1.5] and info["metrics"]["illegal"] == 1.0


def scripted_collector(move: str, group_size: int = 2, memory: int = 0, env_id: str = "openspiel:kuhn_poker"):
    """Whole self-play games (Kuhn poker's by default) where every seat always answers `move`, through the real
    group collector."""
    from horizonrl.agents.agent import Agent
    from horizonrl.agents.prompt import plan_text
    from horizonrl.assembly.warm_start import build_tiny_for_envs
    from horizonrl.config import TinyModel
    from horizonrl.engines.base import SamplingParams
    from horizonrl.engines.scripted import ScriptedEngine
    from horizonrl.envs.pool import open_envs
    from horizonrl.rollout.episode_groups import EnvEpisodes
    from horizonrl.rollout.groups import GroupCollector

    tokenizer, _ = build_tiny_for_envs([envs.make(env_id)], TinyModel(), seed=0, device="cpu")
    handles = open_envs(env_id, {"opponent": "self"}, 2, False, 60.0)
    engine = ScriptedEngine(tokenizer, lambda prompt: plan_text("scripted", move))
    episodes = EnvEpisodes(handles, [env_id], Agent(tokenizer, memory=memory), engine,
                           SamplingParams(max_tokens=32), max_turns=None)
    return GroupCollector(episodes, n_tasks=2, group_size=group_size, seed=0)


def test_every_game_becomes_one_episode_per_seat_grouped_by_seed_and_seat():
    """Both seats always bet: each game is a bet and a call, so one seat wins 2 chips and the other loses 2."""
    episodes = scripted_collector("bet").collect()
    assert len(episodes) == 2 * 2 * 2                          # tasks x rollouts x seats
    groups = {}
    for episode in episodes:
        groups.setdefault(episode.group_id, []).append(episode)
        assert len(episode.turns) == 1 and episode.turns[0].seat == int(episode.group_id[-1])
        assert episode.turns[0].terminated and episode.outcome_reward in (-2.0, 2.0)
        assert episode.metrics["return"] == episode.outcome_reward
        assert episode.metrics["success"] == float(episode.outcome_reward > 0)
        outcome = episode.turns[-1].info["metrics"]                    # the seat's, as a one-seat game's
        assert (outcome["win"], outcome["loss"], outcome["draw"], outcome["illegal"]) == \
            (float(episode.outcome_reward > 0), float(episode.outcome_reward < 0), 0.0, 0.0)
    seed_groups = {group.rsplit("/", 1)[0] for group in groups}
    assert len(seed_groups) == 2 and sorted(groups) == sorted(f"{g}/seat{seat}" for g in seed_groups for seat in (0, 1))
    assert all(len(members) == 2 for members in groups.values())
    for seed_group in seed_groups:
        seat0, seat1 = groups[f"{seed_group}/seat0"], groups[f"{seed_group}/seat1"]
        assert [e.outcome_reward for e in seat0] == [-e.outcome_reward for e in seat1]   # zero-sum, game by game


def test_an_illegal_move_is_the_offending_seats_loss_and_the_others_draw():
    """Both seats always play a1: seat 0 marks it, seat 1 plays the taken cell and loses -1.5; seat 0 gets 0."""
    episodes = scripted_collector("a1", env_id="openspiel:tic_tac_toe").collect()
    assert len(episodes) == 2 * 2 * 2
    for episode in episodes:
        seat = episode.turns[-1].seat
        outcome = episode.turns[-1].info["metrics"]
        assert episode.outcome_reward == (-1.5 if seat == 1 else 0.0)
        assert (outcome["win"], outcome["draw"], outcome["loss"], outcome["illegal"]) == \
            ((0.0, 0.0, 1.0, 1.0) if seat == 1 else (0.0, 1.0, 0.0, 0.0))


def test_self_play_prompts_with_history_are_refused_naming_agent_memory():
    with pytest.raises(ConfigError, match="agent.memory: .* every seat .*set agent.memory=0"):
        scripted_collector("pass", memory=1).collect()


@pytest.mark.parametrize("e_len, games", [(1, 1), (3, 2)])
def test_ppo_streams_play_a_self_play_game_to_its_end_one_episode_per_seat(e_len, games):
    """Both seats always bet: a game is a bet and a call (2 turns). A stream of e_len 1 still plays its game to the
    end; e_len 3 starts a second game on its third turn and plays it out too: whole seat episodes, none to
    bootstrap."""
    from horizonrl.agents.agent import Agent
    from horizonrl.agents.prompt import plan_text
    from horizonrl.assembly.warm_start import build_tiny_for_envs
    from horizonrl.config import TinyModel
    from horizonrl.engines.base import SamplingParams
    from horizonrl.engines.scripted import ScriptedEngine
    from horizonrl.envs.pool import open_envs
    from horizonrl.rollout.fixed_turn import FixedTurnCollector

    tokenizer, _ = build_tiny_for_envs([envs.make("openspiel:kuhn_poker")], TinyModel(), seed=0, device="cpu")
    handles = open_envs("openspiel:kuhn_poker", {"opponent": "self"}, 2, False, 60.0)
    engine = ScriptedEngine(tokenizer, lambda prompt: plan_text("scripted", "bet"))
    collector = FixedTurnCollector(handles, Agent(tokenizer, memory=0), engine, SamplingParams(max_tokens=32), e_len)
    episodes = collector.collect()
    assert len(episodes) == 2 * games * 2                      # streams x games x seats
    assert [e.turns[0].seat for e in episodes] == [0, 1] * 2 * games          # stream by stream, game by game
    for first, second in zip(episodes[::2], episodes[1::2]):
        assert first.episode_id.removesuffix("/seat0") == second.episode_id.removesuffix("/seat1")
        assert sorted((first.turns[0].reward, second.turns[0].reward)) == [-2.0, 2.0]        # zero-sum
    for episode in episodes:
        assert len(episode.turns) == 1 and episode.turns[0].terminated and episode.bootstrap_prompt_ids is None
        assert episode.metrics["return"] == episode.turns[0].reward


def test_ppo_and_a_group_estimator_each_train_a_self_play_game(tmp_path):
    from horizonrl.report.metrics import read_metrics
    from horizonrl.train.loop import train

    common = ["env.id=openspiel:kuhn_poker", "env.kwargs={opponent: self}", "agent.memory=0", "iterations=1",
              "model.warm_start=null", "rollout.n_env=4"]
    ppo = load_config(str(SOURCE_CONFIGS / "toy.yaml"), [*common, "critic.warmup_batches=0", "ppo.e_len=1",
                                                          "optim.mini_batch_size=4", "optim.micro_batch_size=4",
                                                          f"output_dir={tmp_path / 'ppo'}"])
    (record,) = read_metrics(train(ppo, progress=False) / "metrics.jsonl")
    assert record["env/episodes"] >= 4 * 2 and record["env/episodes"] % 2 == 0      # each game's two seats
    assert record["train/actor/skipped_updates"] == 0 and "train/critic/value_loss" in record
    grpo = load_config(str(SOURCE_CONFIGS / "toy.yaml"), [*common, "algorithm=grpo", "group.n_tasks=2",
                                                           "group.group_size=4", f"output_dir={tmp_path / 'grpo'}"])
    (record,) = read_metrics(train(grpo, progress=False) / "metrics.jsonl")
    assert record["env/episodes"] == 2 * 4 * 2 and record["train/actor/skipped_updates"] == 0


def test_validation_scores_a_poker_policy_by_its_exploitability(tmp_path):
    """Validation of a Kuhn self-play run measures the policy's exploitability at iterations 0 and 1; the lower keeps
    best/ (the score is minus it), and the report draws its curve."""
    import json

    from horizonrl.train.loop import train

    cfg = load_config(str(SOURCE_CONFIGS / "toy.yaml"), [
        "env.id=openspiel:kuhn_poker", "env.kwargs={opponent: self}", "agent.memory=0", "iterations=1",
        "model.warm_start=null", "rollout.n_env=4", "algorithm=grpo", "group.n_tasks=2", "group.group_size=4",
        "validation.every=1", "validation.episodes=2", f"output_dir={tmp_path}"])
    run = train(cfg, progress=False)
    lines = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 1]
    for line in lines:
        assert 0.0 <= line["exploitability"]["kuhn_poker"] <= 2.0
        assert line["score"] == -line["exploitability"]["kuhn_poker"]
    assert lines[1]["best"] == (lines[1]["score"] >= lines[0]["score"])
    assert 'data-key="validation/validation: exploitability (kuhn_poker)"' in (run / "report.html").read_text()
