"""Agents we did not write, through the gateway: the example OpenAI agent's calls become episodes whose
merged rows split nowhere, an agent that re-renders its history is split and classified, and every way an
agent can fail is counted and dropped, never a silent zero: a batch's failures are one warning by cause. The
model is the exact Qwen2.5 tokenizer's with a scripted engine (the arithmetic task's teacher) standing in for
the policy, so the calls are known.

From the command line, with a tiny model: the recipe trains (each iteration's record counting the gateway's
requests); an agent that always fails ends the warm start with one message naming the cause, no run folder
made; one that fails from the second iteration on ends the run there, its last checkpoint kept; one whose
merged rows mostly split is told why, once (tests/integration/misbehaving_agents.py)."""

import asyncio
import gc
import json
import logging
import math
import re
import time

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from horizonrl.cli import main
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway import Gateway, GatewayThread, Recorder
from horizonrl.gateway.agent_groups import GatewayAgents, RunSampling
from horizonrl.report.metrics import read_metrics
from horizonrl.rollout.groups import GroupCollector
from horizonrl.samples.merge import merge_turns
from horizonrl.tasks import arithmetic
from horizonrl.tools.registry import import_target

EXAMPLE = "examples/arithmetic_openai_agent.py:agent"


def collector(tokenizer, agent, tasks, group_size=2, reward_fn=None, timeout_s=30.0, engine=None):
    engine = engine or ScriptedEngine(tokenizer, arithmetic.teacher(tasks, mistake_rate=0.0))
    gateway = Gateway(engine, tokenizer, "policy", 32768, (tokenizer.eos_token_id,), Recorder(issued_only=True),
                      max_tokens_limit=64, max_n=1)
    agents = GatewayAgents(agent, lambda seed: tasks[seed % len(tasks)], gateway, reward_fn, timeout_s)
    return GroupCollector(agents, len(tasks), group_size)


def run(tokenizer, agent, tasks, **kwargs):
    groups = collector(tokenizer, agent, tasks, **kwargs)
    try:
        return groups.run(tasks), groups.errors
    finally:
        groups.close()


def warnings(caplog) -> list[str]:
    """The warnings horizonrl logged."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("horizonrl")]


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
    (raises, "agent raised RuntimeError: agent bug"), (sleeps, "agent timed out after 0.5 s"),
    (never_calls, "agent made no model call"), (no_reward, "agent returned no reward and posted none"),
    (nan_reward, "agent returned a reward that is not a finite number: nan"),
    (not_async, "agent raised TypeError: task.agent must be an `async def` function: it returned float, not a "
                "coroutine")])
def test_a_failed_agent_is_counted_and_left_out_of_its_group(qwen_tokenizer, agent, error):
    tasks = [arithmetic.make_task(0)]
    # only `sleeps` is meant to time out: an agent that makes a model call may take over 0.5 s on a busy machine
    timeout_s = 0.5 if agent is sleeps else 30.0
    episodes, errors = run(qwen_tokenizer, agent, tasks, timeout_s=timeout_s, engine=echo_engine(qwen_tokenizer))
    assert errors == [error, error]                           # the cause, the same for each: no episode id
    assert all(e.metrics == {"error": error} and e.outcome_reward is None for e in episodes)


CAUSES = {1: "no tool", 3: "no tool", 9: "no tool", 5: "tool is down", 11: "tool is down", 7: "quota exceeded"}


async def fails_on_odd_seeds(task, base_url):
    if task["seed"] in CAUSES:
        raise RuntimeError(CAUSES[task["seed"]])
    return await nan_reward(task, base_url)


def test_a_batchs_failures_are_one_warning_by_cause_the_most_common_first(qwen_tokenizer, caplog):
    """11 tasks x 2 rollouts, all failing: 10 return nan (even seeds), 6 raise "no tool", 4 "tool is down", 2
    "quota exceeded". Each failure is a DEBUG line naming its rollout; the batch's are one warning."""
    tasks = [arithmetic.make_task(seed) for seed in [0, 2, 4, 6, 8, *CAUSES]]
    with caplog.at_level(logging.DEBUG, logger="horizonrl"):
        episodes, errors = run(qwen_tokenizer, fails_on_odd_seeds, tasks, engine=echo_engine(qwen_tokenizer))
    assert len(episodes) == len(errors) == 22
    assert warnings(caplog) == [
        "22 of 22 rollouts dropped from their groups: agent returned a reward that is not a finite number: nan (10); "
        "agent raised RuntimeError: no tool (6); agent raised RuntimeError: tool is down (4); 2 more of 1 other cause"]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "dropped" in r.getMessage()]
    assert len(debug) == 22
    assert "arithmetic/seed7/rollout1 dropped from its group: the agent raised RuntimeError: quota exceeded" in debug


def test_the_gateways_counts_are_those_of_the_last_batch(qwen_tokenizer):
    """Each rollout of `posts_its_reward` makes 2 model calls and posts a reward: 3 requests."""
    groups = collector(qwen_tokenizer, posts_its_reward, [arithmetic.make_task(0)], group_size=2,
                       engine=echo_engine(qwen_tokenizer))
    counts = []
    try:
        for _ in range(2):
            groups.collect()
            counts.append(groups.counts)
    finally:
        groups.close()
    for batch in counts:
        assert batch["gateway/requests"] == 6 and batch["gateway/errors"] == batch["gateway/server_errors"] == 0
        assert set(batch) >= {"gateway/requests", "gateway/errors", "gateway/server_errors",
                              "gateway/tool_call_parse_failures"}



def test_garbage_the_gateways_thread_collects_is_finalised_with_no_loop_running(qwen_tokenizer):
    """Python collects garbage in whichever thread allocates, the agents' too. An unclosed openai.AsyncOpenAI (as
    `one_call` leaves them) schedules its aclose() on the running loop when finalised: on the gateway's loop it
    closed an agent's socket by a number the agents' loop had since given a new connection, whose answer that
    agent then never read (the test above failed so, an agent timed out, 5 of 6 requests counted)."""
    seen = []

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            try:
                seen.append(asyncio.get_running_loop())
            except RuntimeError:
                seen.append(None)

    async def collect():
        Cycle()
        gc.collect()
        return asyncio.get_running_loop()

    server = GatewayThread(Gateway(echo_engine(qwen_tokenizer), qwen_tokenizer, "policy", 32768,
                                   (qwen_tokenizer.eos_token_id,)))
    server.start()
    try:
        running = asyncio.run_coroutine_threadsafe(collect(), server.loop).result()
    finally:
        server.stop()
    assert seen == [None] and running is server.loop

class SlowEngine(ScriptedEngine):
    """The scripted answer after `delay_s`, counting the calls started, in flight and run to the end."""

    def __init__(self, tokenizer, delay_s: float):
        super().__init__(tokenizer, lambda prompt: "The answer is 2.")
        self.delay_s, self.started, self.in_flight, self.finished = delay_s, 0, 0, 0

    async def generate(self, prompt_ids, params):
        self.started += 1
        self.in_flight += 1
        try:
            await asyncio.sleep(self.delay_s)
            generation = await super().generate(prompt_ids, params)
            self.finished += 1
            return generation
        finally:
            self.in_flight -= 1


def test_a_timed_out_agents_generation_is_over_when_collect_returns(qwen_tokenizer):
    """The agent gives up (times out) while its generation, five times as long, runs; the gateway's handler,
    which aiohttp does not cancel, would go on generating through the update and the weight sync after collect
    returned. On a busy machine the agent may time out before its call reaches the engine: then it is tried again
    with a longer time limit, until the timeout lands during the generation (the case under test)."""
    for timeout_s in (0.3, 1.0, 3.0, 10.0):
        engine = SlowEngine(qwen_tokenizer, delay_s=5 * timeout_s)
        groups = collector(qwen_tokenizer, no_reward, [arithmetic.make_task(0)], group_size=1, timeout_s=timeout_s,
                           engine=engine)
        try:
            episodes = groups.collect()
            in_flight, started, finished = engine.in_flight, engine.started, engine.finished
        finally:
            groups.close()
        if started:
            break
    assert groups.errors == [f"agent timed out after {timeout_s} s"]
    assert episodes[0].turns == [] and (in_flight, started, finished) == (0, 1, 1)


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


RECIPE = "configs/arithmetic_openai_agent.yaml"
AGENTS = "tests/integration/misbehaving_agents.py"
SMALL = ["group.n_tasks=2", "group.group_size=4", "model.warm_start.steps=30", "model.warm_start.iterations=1",
         "device=cpu"]     # 8 rollouts a batch; the warm start's teacher plays batches of 8 tasks


@pytest.mark.parametrize("algorithm,samples", [("grpo", "merged"), ("gigpo", "per_turn")])
def test_the_openai_agent_recipe_trains_two_iterations_from_the_command_line(tmp_path, algorithm, samples, caplog):
    assert open(RECIPE).readline() == f"# horizonrl train {RECIPE}\n"
    assert main(["train", RECIPE, "iterations=2", *SMALL, f"algorithm={algorithm}", f"samples={samples}",
                 f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [(r["iteration"], r["phase"]) for r in records] == [(1, algorithm), (2, algorithm)]
    for record in records:
        assert record["env/errors"] == 0 and record["env/episodes"] == 8 and record["env/turns"] >= 8
        assert "train/actor/pg_loss" in record and record["rollout/logprob_abs_diff"] < 1e-4
        assert ("data/merge/turns" in record) == (samples == "merged")
        assert ("gigpo/anchored_step_frac" in record) == (algorithm == "gigpo")
        # the iteration's gateway counts: a call per turn, none refused, its tool-call parse failures the turns'
        assert record["gateway/requests"] == record["env/turns"]
        assert record["gateway/errors"] == record["gateway/server_errors"] == 0
        assert record["gateway/tool_call_parse_failures"] == record["rollout/tool_call_parse_failures"]
    assert "split" not in caplog.text                           # merged rows split nowhere: nothing to explain


def test_an_agent_that_always_fails_ends_the_warm_start_with_one_message_naming_the_cause(tmp_path, capsys, caplog):
    """Before, the warm start logged a warning per dropped rollout, then failed in supervised_finetune with
    `RuntimeError: random_ expects 'from' to be less than 'to'` (zero demonstration rows)."""
    assert main(["train", RECIPE, f"task.agent={AGENTS}:always_fails", *SMALL, f"output_dir={tmp_path}",
                 "--quiet"]) == 1
    assert capsys.readouterr().err == (
        "horizonrl: every teacher rollout of the warm start's first batch failed (8 of 8), so there is nothing to "
        "learn from (the scripted teacher answered every call: the agent fails on its own, or its requests do); "
        "nothing was saved; the failures, most common first:\n"
        "  agent raised RuntimeError: the agent's search tool is down (8)\n")
    assert warnings(caplog) == [      # one for the batch, none per rollout
        "8 of 8 rollouts dropped from their groups: agent raised RuntimeError: the agent's search tool is down (8)"]
    assert not list(tmp_path.iterdir())                         # no run folder


def test_an_agent_that_needs_constrained_decoding_fails_at_its_first_call_without_tis(tmp_path, capsys):
    """A forced tool call is sampled under a grammar, which the learner corrects only by TIS: without actor.tis_cap
    the gateway refuses it from the warm start on (whose teacher would answer it), so the run ends there."""
    assert main(["train", RECIPE, f"task.agent={AGENTS}:forces_a_tool_call", *SMALL, f"output_dir={tmp_path}",
                 "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "every teacher rollout of the warm start's first batch failed (8 of 8)" in error
    assert "tool_choice: constrained decoding" in error and "set actor.tis_cap" in error
    assert not list(tmp_path.iterdir())


def test_an_iteration_whose_rollouts_all_fail_ends_the_run_and_keeps_the_last_checkpoint(tmp_path, capsys, caplog):
    """Iteration 1 trains and saves its checkpoint; every rollout of iteration 2 fails: the run ends with one
    message, and nothing is saved on the way out (no new checkpoint, no final model)."""
    assert main(["train", RECIPE, f"task.agent={AGENTS}:fails_from_the_second_batch", *SMALL, "iterations=3",
                 "save_every=1", f"output_dir={tmp_path}", "--quiet"]) == 1
    (run,) = tmp_path.iterdir()
    assert capsys.readouterr().err == (
        "horizonrl: iteration 2: every episode of the batch failed (8 of 8), so the update has no rows to train on; "
        "the failures, most common first:\n"
        "  agent raised RuntimeError: the agent's search tool is down (8)\n"
        f"The run folder {run} keeps its last checkpoint, iter_000001; nothing was saved on the way out. Once the "
        f"cause is fixed, continue with:\n    horizonrl train --resume {run}\n")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001"]
    assert json.loads((run / "checkpoints/iter_000001/training_state.json").read_text())["iteration"] == 1
    assert not (run / "checkpoint").exists()
    assert [r["iteration"] for r in read_metrics(run / "metrics.jsonl")] == [1]
    assert warnings(caplog) == [      # one for the batch, none per rollout
        "8 of 8 rollouts dropped from their groups: agent raised RuntimeError: the agent's search tool is down (8)"]


def test_a_run_whose_merged_rows_mostly_split_is_told_why_once(tmp_path, caplog):
    """The agent sends its tool calls back as assistant text (as smolagents does): every second call of an
    episode re-renders the first one's answer, so it splits, in both iterations; the run is told once. (The
    tiny tokenizer has no special tokens for tool calls, so the texts differ: `other` splits. Qwen's
    <tool_call> is one: `template`.) A warm start of 100 steps makes the model call the tool."""
    assert main(["train", RECIPE, f"task.agent={AGENTS}:sends_tool_calls_as_text", *SMALL, "iterations=2",
                 "model.warm_start.steps=100", f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    records = read_metrics(run / "metrics.jsonl")
    assert all(r["data/merge/split_other"] > r["data/merge/merged"] for r in records), records
    (told,) = [r.getMessage() for r in caplog.records if r.name == "horizonrl.train.phases"]
    split = sum(records[0][f"data/merge/split_{name}"] for name in ("template", "retoken", "other", "length"))
    assert told.startswith(f"iteration 1: {split} of the {split + records[0]['data/merge/merged']} turns that could "
                           f"have merged into their episode's row started a row of their own, "
                           f"{records[0]['data/merge/split_other']} of them `other` splits: the agent changes its "
                           "history's text between calls"), told
    assert "What to do: send the model's messages back unchanged (tool calls as `tool_calls` messages)" in told
