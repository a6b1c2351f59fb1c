"""A program of several agents through the gateway (`task.agents`): each agent's client calls on its own URL
(`agent_url`), its calls are recorded under its name, its reward (returned or posted) is its own, and the collector
makes one episode per agent, grouped by task and agent. The engine is scripted; the tokenizer is Qwen2.5's."""

import httpx
import pytest
from openai import AsyncOpenAI

from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway import Gateway, Recorder
from horizonrl.gateway.agent_groups import GatewayAgents, agent_url
from horizonrl.rollout.groups import GroupCollector
from horizonrl.tasks import arithmetic

AGENTS = ("solver", "checker")


async def ask(base_url: str, system: str, user: str) -> str:
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(model="m", messages=[{"role": "system", "content": system},
                                                                      {"role": "user", "content": user}])
    return reply.choices[0].message.content


async def solve_and_check(task: dict, base_url: str) -> dict[str, float]:
    """The solver answers, the checker reads the answer, the solver answers again: calls solver, checker, solver."""
    problem = task["messages"][-1]["content"]
    first = await ask(agent_url(base_url, "solver"), "You solve.", problem)
    verdict = await ask(agent_url(base_url, "checker"), "You check answers.", f"{problem}\nAnswer: {first}")
    await ask(agent_url(base_url, "solver"), "You solve.", f"{problem}\nA checker said: {verdict}")
    return {"solver": 1.0, "checker": 0.5}


async def posts_each_agents_reward(task: dict, base_url: str) -> None:
    await ask(agent_url(base_url, "solver"), "You solve.", "1 + 1")
    await ask(agent_url(base_url, "checker"), "You check answers.", "1 + 1 = 2?")
    async with httpx.AsyncClient() as http:
        for name, reward in (("solver", -1.0), ("checker", 2.0)):
            response = await http.post(f"{base_url.removesuffix('/v1')}/agents/{name}/reward", json={"reward": reward})
            assert response.status_code == 200


async def an_undeclared_agent(task: dict, base_url: str) -> dict[str, float]:
    await ask(agent_url(base_url, "stranger"), "You are new.", "1 + 1")
    return {"stranger": 1.0}


async def forgets_the_checker(task: dict, base_url: str) -> dict[str, float]:
    await ask(agent_url(base_url, "checker"), "You check answers.", "1 + 1 = 2?")
    return {"solver": 1.0}


def play(tokenizer, agent, n_tasks=2, group_size=2):
    tasks = [arithmetic.make_task(seed) for seed in range(n_tasks)]
    gateway = Gateway(ScriptedEngine(tokenizer, lambda prompt: "The answer is 2."), tokenizer, "policy", 32768,
                      (tokenizer.eos_token_id,), Recorder(issued_only=True), max_tokens_limit=64, max_n=1)
    groups = GroupCollector(GatewayAgents(agent, lambda seed: tasks[seed % len(tasks)], gateway, None, 30.0, AGENTS),
                            n_tasks, group_size)
    try:
        return tasks, groups.run(tasks), groups.errors
    finally:
        groups.close()


def test_each_agent_of_a_program_is_an_episode_of_its_own_calls_and_reward(qwen_tokenizer):
    tasks, episodes, errors = play(qwen_tokenizer, solve_and_check)
    assert errors == [] and len(episodes) == 2 * 2 * 2                 # tasks x rollouts x agents
    for episode in episodes:
        seat = int(episode.group_id.rsplit("/seat", 1)[1])
        name = AGENTS[seat]
        assert episode.group_id.rsplit("/seat", 1)[0] in {task.task_id for task in tasks}
        assert [turn.info["agent"] for turn in episode.turns] == [name] * (2 if name == "solver" else 1)
        assert all(turn.seat == seat for turn in episode.turns)
        assert episode.outcome_reward == {"solver": 1.0, "checker": 0.5}[name]
        system = {"solver": "You solve.", "checker": "You check answers."}[name]
        assert all(system in qwen_tokenizer.decode(turn.prompt_ids) for turn in episode.turns)
        assert episode.turns[-1].terminated and not any(turn.terminated for turn in episode.turns[:-1])


def test_each_agent_may_post_its_own_reward(qwen_tokenizer):
    _, episodes, errors = play(qwen_tokenizer, posts_each_agents_reward, n_tasks=1, group_size=1)
    assert errors == [] and sorted((e.group_id.rsplit("/", 1)[1], e.outcome_reward) for e in episodes) == \
        [("seat0", -1.0), ("seat1", 2.0)]


@pytest.mark.parametrize("agent, error", [
    (an_undeclared_agent, "agent called the model as agent 'stranger'; task.agents declares solver, checker"),
    (forgets_the_checker, "agent gave no reward to agent checker"),
])
def test_a_program_that_calls_as_no_declared_agent_or_rewards_none_is_dropped_naming_why(qwen_tokenizer, agent,
                                                                                          error):
    _, episodes, errors = play(qwen_tokenizer, agent, n_tasks=1, group_size=1)
    assert len(errors) == 1 and errors[0].startswith(error) and all("error" in e.metrics for e in episodes)
