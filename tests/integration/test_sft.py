"""Expert demonstrations (BabyAI's bot) and `horizonrl sft` on them."""

import json

import pytest
import torch

from horizonrl.agents.agent import Agent
from horizonrl.cli import main
from horizonrl.envs.babyai import BabyAIEnv
from horizonrl.train.demonstrations import expert_episodes
from horizonrl.train.warm_start import build_tiny_for_envs
from horizonrl.config import TinyModel
from horizonrl.records import Episode

torch.set_num_threads(1)


@pytest.mark.parametrize("task", ["goto", "pickup", "open", "pick_up_seq_go_to"])
def test_following_the_bot_solves_babyai_tasks(task):
    env = BabyAIEnv(task)
    for seed in range(5):
        env.reset(seed)
        for _ in range(env.max_steps):
            action, reason = env.expert_action()
            assert action in env.actions and reason
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert terminated and info["success"] and reward == 1.0


def test_expert_episodes_are_rendered_through_the_agents_own_prompts():
    env = BabyAIEnv("goto")
    tokenizer, _ = build_tiny_for_envs([env], TinyModel(), seed=0, device=torch.device("cpu"))
    agent = Agent(tokenizer, memory=1)
    demos: list[Episode] = expert_episodes(agent, "babyai/goto", {}, episodes=4, max_turns=64, seed=0)
    assert len(demos) == 4 and all(e.metrics["success"] for e in demos)
    for episode in demos:
        first = episode.turns[0]
        observation, _ = env.reset(episode.seed)
        assert first.prompt_ids == agent.prompt_ids(env, [], observation)   # exactly the agent's prompt
        for turn in episode.turns:
            text = tokenizer.decode(turn.response_ids, skip_special_tokens=True)
            assert turn.valid_action and text.startswith("THINK: ") and text.endswith(f"ACTION: {turn.action}")
            assert turn.response_logprobs is None   # no model sampled them


def test_an_env_without_an_expert_is_refused_with_one_message():
    env = BabyAIEnv("goto")
    tokenizer, _ = build_tiny_for_envs([env], TinyModel(), seed=0, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="river has no expert"):
        expert_episodes(Agent(tokenizer), "river", {}, episodes=1, max_turns=8, seed=0)


def test_sft_command_fits_the_demonstrations_and_saves_a_checkpoint(tmp_path):
    args = ["sft", "env.id=babyai/goto", "env.kwargs={}", "sft.episodes=16", "sft.steps=40", "sft.batch_size=16",
            "name=goto-sft", f"output_dir={tmp_path}"]
    assert main(args) == 0
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["phase"] == "demonstrations" and records[0]["env/success_rate"] == 1.0
    losses = [r["sft/loss"] for r in records[1:]]
    assert len(losses) == 40 and sum(losses[-5:]) < 0.5 * sum(losses[:5])
    assert (run_dir / "checkpoint" / "config.json").exists()


def test_sft_on_several_env_ids_demonstrates_each(tmp_path):
    args = ["sft", "env.id=[babyai/goto, babyai/pickup]", "env.kwargs={}", "sft.episodes=3", "sft.steps=2",
            "name=two-tasks", f"output_dir={tmp_path}"]
    assert main(args) == 0
    (run_dir,) = tmp_path.iterdir()
    demonstrations = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert demonstrations["env/episodes"] == 6
    assert demonstrations["env/babyai/goto/success_rate"] == demonstrations["env/babyai/pickup/success_rate"] == 1.0
