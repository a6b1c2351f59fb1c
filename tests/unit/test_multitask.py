"""Multi-task runs: `env.id` as a list of env ids, one per stream in turn, with per-task metrics."""

import pytest

from horizonrl.config import SOURCE_CONFIGS, ConfigError, load_config
from horizonrl.envs.pool import open_envs
from horizonrl.records import Episode, Turn
from horizonrl.report.html import task_plots
from horizonrl.report.metrics import episode_metrics

TOY = SOURCE_CONFIGS / "toy.yaml"


def test_a_list_of_env_ids_is_accepted_and_checked_id_by_id():
    cfg = load_config(TOY, ["env.id=[babyai/goto, babyai/pickup]", "env.kwargs={}"])
    assert cfg.env.ids == ["babyai/goto", "babyai/pickup"]
    assert load_config(TOY, []).env.ids == ["river"]
    with pytest.raises(ConfigError, match="env.id: unknown env 'babyai/gotoo'"):
        load_config(TOY, ["env.id=[babyai/goto, babyai/gotoo]", "env.kwargs={}"])
    with pytest.raises(ConfigError, match="env.id: an empty list names no env"):
        load_config(TOY, ["env.id=[]"])
    grouped = load_config(TOY, ["env.id=[babyai/goto, babyai/pickup]", "env.kwargs={}", "algorithm=grpo"])
    assert grouped.env.ids == ["babyai/goto", "babyai/pickup"]
    with pytest.raises(ConfigError, match="rollout.n_env: 1 env handles cannot play each of the 2 env ids"):
        load_config(TOY, ["env.id=[babyai/goto, babyai/pickup]", "env.kwargs={}", "algorithm=grpo", "rollout.n_env=1"])


def test_streams_take_the_env_ids_in_turn():
    handles = open_envs(["river", "babyai/goto"], {}, 5, workers=False, timeout_s=10)
    try:
        assert [h.env_id for h in handles] == ["river", "babyai/goto", "river", "babyai/goto", "river"]
    finally:
        for handle in handles:
            handle.close()


def _episode(task: str, success: float) -> Episode:
    turn = Turn([1], [2], None, success, True, False, "a", True, {})
    episode = Episode(f"{task}/seed0", task, 0)
    episode.turns.append(turn)
    episode.metrics = {"return": success, "length": 1, "success": success, "invalid_actions": 0}
    return episode


def test_success_rate_per_task_only_for_several_tasks():
    episodes = [_episode("goto", 1.0), _episode("goto", 0.0), _episode("pickup", 1.0)]
    metrics = episode_metrics(episodes)
    assert metrics["env/success_rate"] == pytest.approx(2 / 3)
    assert metrics["env/goto/success_rate"] == 0.5 and metrics["env/pickup/success_rate"] == 1.0
    assert not [k for k in episode_metrics(episodes[:2]) if k.startswith("env/goto/")]
    assert task_plots([metrics]) == [("success rate: goto", "env/goto/success_rate"),
                                     ("success rate: pickup", "env/pickup/success_rate")]
