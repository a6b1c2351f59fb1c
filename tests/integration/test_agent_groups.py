"""Agents we did not write, through the gateway: the example OpenAI agent's calls become episodes whose
merged rows split nowhere, an agent that re-renders its history is split and classified, and every way an
agent can fail is counted and dropped, never a silent zero. The model is the exact Qwen2.5 tokenizer's with
a scripted engine (the arithmetic task's teacher) standing in for the policy, so the calls are known."""

import asyncio
import logging
import math
import re
import time

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway import Gateway, Recorder
from horizonrl.gateway.agent_groups import AgentGroupCollector, RunSampling
from horizonrl.samples.merge import merge_turns
from horizonrl.tasks import arithmetic
from horizonrl.tools.registry import import_target

EXAMPLE = "examples/arithmetic_openai_agent.py:agent"


def collector(tokenizer, agent, tasks, group_size=2, reward_fn=None, timeout_s=30.0, engine=None):
    engine = engine or ScriptedEngine(tokenizer, arithmetic.teacher(tasks, mistake_rate=0.0))
    gateway = Gateway(engine, tokenizer, "policy", 32768, (tokenizer.eos_token_id,), Recorder(issued_only=True),
                      max_tokens_limit=64, max_n=1)
    return AgentGroupCollector(agent, lambda seed: tasks[seed % len(tasks)], gateway, len(tasks), group_size,
                               reward_fn, timeout_s)


def run(tokenizer, agent, tasks, **kwargs):
    groups = collector(tokenizer, agent, tasks, **kwargs)
    try:
        return groups.run(tasks), groups.errors
    finally:
        groups.close()


def test_the_example_agent_becomes_merged_episodes_with_no_split(qwen_tokenizer, caplog):
    tasks = [arithmetic.make_task(seed) for seed in range(3)]
    episodes, errors = run(qwen_tokenizer, import_target(EXAMPLE), tasks)
    assert errors == [] and len(episodes) == 6
    assert "blocked" not in caplog.text                      # AsyncOpenAI: the agents never block their loop
    for episode, task in zip(episodes, [t for t in tasks for _ in range(2)]):
        assert episode.group_id == task.task_id and episode.outcome_reward == 1.0
        call, answer = episode.turns                            # the calculator call, then the answer
        assert call.info["response"]["tool_calls"][0]["function"]["name"] == "calculator"
        assert answer.info["text"] == f"The answer is {task.data['answer']}."
        assert answer.prompt_ids[:len(call.prompt_ids) + len(call.response_ids)] == call.prompt_ids + call.response_ids
        assert [t.terminated for t in episode.turns] == [False, True]
        # the first call's prompt is the chat template's rendering of the task and the agent's tool schema
        tools = [{"type": "function", "function": {
            "name": "calculator", "description": "Evaluate an arithmetic expression with integers, + - * and "
                                                 "parentheses.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]}}}]
        assert call.prompt_ids == list(qwen_tokenizer.apply_chat_template(
            task.messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    samples, report = merge_turns(episodes, 4096, 4096, qwen_tokenizer)
    assert len(samples.input_ids) == 6 and report.as_metrics()["data/merge/merged"] == 6
    assert report.splits == {"template": 0, "retoken": 0, "other": 0, "length": 0}


async def blocking_agent(task: dict, base_url: str) -> float:
    """A synchronous client inside `async def`: its call, and 1.5 s standing in for a model that takes
    seconds to answer, hold the event loop every agent runs on."""
    OpenAI(base_url=base_url, api_key="unused", max_retries=0).chat.completions.create(model="m",
                                                                                        messages=task["messages"])
    time.sleep(1.5)
    return 1.0


def test_an_agent_that_blocks_the_event_loop_is_reported_once(qwen_tokenizer, caplog):
    tasks = [arithmetic.make_task(seed) for seed in range(2)]
    groups = collector(qwen_tokenizer, blocking_agent, tasks, group_size=1)
    try:
        with caplog.at_level(logging.WARNING, logger="horizonrl.gateway.agent_groups"):
            first, second = groups.run(tasks), groups.run(tasks)
    finally:
        groups.close()
    assert groups.errors == [] and [len(e.turns) for e in first + second] == [1, 1, 1, 1]
    (warning,) = [r.getMessage() for r in caplog.records if "blocked" in r.getMessage()]   # once, not per batch
    assert "openai.AsyncOpenAI" in warning
    assert float(re.search(r"loop for ([\d.]+) s", warning)[1]) >= 2.9    # the two agents, one after the other


def test_one_stall_in_a_batch_of_async_agents_is_not_reported(qwen_tokenizer, caplog):
    blocked_once = []

    async def agent(task: dict, base_url: str) -> float:
        """The first call blocks 1.2 s (like a slow first import); every agent then waits 3 s, awaiting."""
        if not blocked_once:
            blocked_once.append(time.sleep(1.2))
        await AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0).chat.completions.create(
            model="m", messages=task["messages"])
        await asyncio.sleep(3)
        return 1.0

    episodes, errors = run(qwen_tokenizer, agent, [arithmetic.make_task(0)])
    assert errors == [] and len(episodes) == 2 and blocked_once
    assert "blocked" not in caplog.text                      # 1.2 s of a ~4.3 s batch


async def rewriting_agent(task: dict, base_url: str) -> float:
    """Calls the model twice, the second time with its first answer rewritten in its history."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = list(task["messages"])
    first = await client.chat.completions.create(model="m", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content.upper()},
                 {"role": "user", "content": "Check again."}]
    await client.chat.completions.create(model="m", messages=messages)
    return 1.0


def test_an_agent_that_rewrites_its_history_is_split_and_classified(qwen_tokenizer):
    episodes, errors = run(qwen_tokenizer, rewriting_agent, [arithmetic.make_task(7)], group_size=1,
                           engine=echo_engine(qwen_tokenizer))
    assert errors == [] and len(episodes[0].turns) == 2
    samples, report = merge_turns(episodes, 4096, 4096, qwen_tokenizer)
    assert len(samples.input_ids) == 2 and report.splits == {"template": 0, "retoken": 0, "other": 1, "length": 0}
    (mismatch,) = report.mismatches
    assert mismatch["class"] == "other" and "THE ANSWER IS 2." in mismatch["actual_text"]


async def raises(task, base_url):
    raise RuntimeError("agent bug")


async def sleeps(task, base_url):
    await asyncio.sleep(60)


async def never_calls(task, base_url):
    return 1.0


def not_async(task, base_url):
    return 1.0


async def one_call(base_url: str, **kwargs) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Problem: 1 + 1"}],
                                         **kwargs)


async def no_reward(task, base_url):
    await one_call(base_url)


async def nan_reward(task, base_url):
    await one_call(base_url)
    return math.nan


async def posts_its_reward(task, base_url):
    await one_call(base_url)
    await one_call(base_url)
    rollout_url = base_url.removesuffix("/v1")
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{rollout_url}/reward", json={"reward": 0.5, "call_rewards": {"1": 0.25}})
    assert response.status_code == 200


def echo_engine(tokenizer):
    return ScriptedEngine(tokenizer, lambda prompt: "The answer is 2.")


@pytest.mark.parametrize("agent,error", [
    (raises, "the agent raised RuntimeError: agent bug"), (sleeps, "the agent timed out after 0.5 s"),
    (never_calls, "the agent made no model call"), (no_reward, "the agent returned no reward and posted none"),
    (nan_reward, "the agent returned a reward that is not a finite number: nan"),
    (not_async, "the agent raised TypeError: task.agent must be an `async def` function: it returned float, not a "
                "coroutine")])
def test_a_failed_agent_is_counted_and_left_out_of_its_group(qwen_tokenizer, agent, error):
    tasks = [arithmetic.make_task(0)]
    episodes, errors = run(qwen_tokenizer, agent, tasks, timeout_s=0.5, engine=echo_engine(qwen_tokenizer))
    assert errors == [f"arithmetic/seed0/rollout{k}: {error}" for k in range(2)]
    assert all(e.metrics == {"error": error.removeprefix("the ")} and e.outcome_reward is None for e in episodes)


class SlowEngine(ScriptedEngine):
    """The scripted answer after `delay_s`, counting the calls in flight and those that ran to the end."""

    def __init__(self, tokenizer, delay_s: float):
        super().__init__(tokenizer, lambda prompt: "The answer is 2.")
        self.delay_s, self.in_flight, self.finished = delay_s, 0, 0

    async def generate(self, prompt_ids, params):
        self.in_flight += 1
        try:
            await asyncio.sleep(self.delay_s)
            generation = await super().generate(prompt_ids, params)
            self.finished += 1
            return generation
        finally:
            self.in_flight -= 1


def test_a_timed_out_agents_generation_is_over_when_collect_returns(qwen_tokenizer):
    """The agent gives up (times out) 0.3 s into a 1.5 s generation; the gateway's handler, which aiohttp does
    not cancel, would go on generating through the update and the weight sync after collect returned."""
    engine = SlowEngine(qwen_tokenizer, delay_s=1.5)
    groups = collector(qwen_tokenizer, no_reward, [arithmetic.make_task(0)], group_size=1, timeout_s=0.3,
                       engine=engine)
    try:
        episodes = groups.collect()
        in_flight, finished = engine.in_flight, engine.finished
    finally:
        groups.close()
    assert groups.errors == ["arithmetic/seed0/rollout0: the agent timed out after 0.3 s"]
    assert episodes[0].turns == [] and (in_flight, finished) == (0, 1)


def test_a_posted_reward_and_call_rewards_are_the_episodes(qwen_tokenizer):
    episodes, errors = run(qwen_tokenizer, posts_its_reward, [arithmetic.make_task(0)], group_size=1,
                           engine=echo_engine(qwen_tokenizer))
    assert errors == [] and episodes[0].outcome_reward == 0.5 and episodes[0].metrics["success"] == 1.0
    assert [turn.reward for turn in episodes[0].turns] == [0.0, 0.25]


def test_without_a_reward_the_runs_reward_fn_scores_the_episode(qwen_tokenizer):
    episodes, errors = run(qwen_tokenizer, no_reward, [arithmetic.make_task(0)], group_size=1,
                           engine=echo_engine(qwen_tokenizer), reward_fn=lambda e: float(len(e.turns)))
    assert errors == [] and episodes[0].outcome_reward == 1.0


class ParamsSeen(ScriptedEngine):
    """The scripted answer, noting the sampling parameters of every call."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, lambda prompt: "The answer is 2.")
        self.seen: list[SamplingParams] = []

    async def generate(self, prompt_ids, params):
        self.seen.append(params)
        return await super().generate(prompt_ids, params)


async def greedy_agent(task, base_url):
    await one_call(base_url, temperature=0.0, top_p=0.5, max_tokens=8)
    return 0.0


def test_training_samples_at_the_runs_temperature_whatever_the_agent_asks(qwen_tokenizer):
    engine = ParamsSeen(qwen_tokenizer)
    episodes, errors = run(qwen_tokenizer, greedy_agent, [arithmetic.make_task(0)], group_size=1,
                           engine=RunSampling(engine, temperature=1.0, top_p=1.0))
    assert errors == [] and [(p.temperature, p.top_p, p.max_tokens) for p in engine.seen] == [(1.0, 1.0, 8)]


@pytest.mark.parametrize("algorithm,samples", [("grpo", "merged"), ("gigpo", "per_turn")])
def test_the_openai_agent_recipe_trains_two_iterations_from_the_command_line(tmp_path, algorithm, samples):
    from horizonrl.cli import main
    from horizonrl.report.metrics import read_metrics

    recipe = "configs/arithmetic_openai_agent.yaml"
    assert open(recipe).readline() == f"# horizonrl train {recipe}\n"
    assert main(["train", recipe, "iterations=2", "group.n_tasks=2", "group.group_size=4", "model.warm_start.steps=30",
                 "model.warm_start.iterations=1", f"algorithm={algorithm}", f"samples={samples}", "device=cpu",
                 f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [(r["iteration"], r["phase"]) for r in records] == [(1, algorithm), (2, algorithm)]
    for record in records:
        assert record["env/errors"] == 0 and record["env/episodes"] == 8 and record["env/turns"] >= 8
        assert "train/actor/pg_loss" in record and record["rollout/logprob_abs_diff"] < 1e-4
        assert ("data/merge/turns" in record) == (samples == "merged")
        assert ("gigpo/anchored_step_frac" in record) == (algorithm == "gigpo")
