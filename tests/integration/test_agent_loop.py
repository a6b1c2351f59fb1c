"""The agent loop state machine on the exact Qwen2.5 tokenizer: every transition, budgets, tool
failures, interactions and scheduler hooks, and the token contract (tool output mask 0, sampled ids
mask 1, one merged row per episode)."""

import asyncio
import json

import pytest

from horizonrl.engines.base import Generation, SamplingParams
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.records import Task
from horizonrl.rollout.agent_loop import (AgentLoop, State, Trajectory, generating, interacting, pending,
                                          processing_tools)
from horizonrl.rollout.interaction import Feedback, MultiTurnScheduler, as_interaction
from horizonrl.rollout.groups import GroupCollector
from horizonrl.rollout.task_groups import AgentLoopTasks
from horizonrl.samples.merge import merge_turns
from horizonrl.tasks import arithmetic
from horizonrl.tools import calculator, tool, tool_table


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@tool
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "done"


@tool
def broken() -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


@tool
def shout(text: str) -> str:
    """Repeat text many times."""
    return " ".join([text] * 200)


TOOLS = tool_table([calculator, slow, broken, shout])
TASK = Task("t/0", 0, [{"role": "system", "content": "S"}, {"role": "user", "content": "Problem: 2+3?"}],
            {"answer": 5})


def scripted(tok, responses, **kwargs):
    """An agent loop whose engine answers the n-th call with responses[n]."""
    replies = iter(responses)
    return AgentLoop(tok, ScriptedEngine(tok, lambda _: next(replies)), SamplingParams(max_tokens=64),
                     **{"tools": TOOLS, **kwargs})


def run(loop, task=TASK):
    return asyncio.run(loop.run(task, "e0", "g0"))


def test_each_state_function_returns_the_next_state(qwen_tokenizer):
    tok = qwen_tokenizer
    loop = scripted(tok, [call("calculator", expression="2+3"), "The answer is 5."],
                    interaction_factory=lambda: as_interaction(Verifier()))
    trajectory = Trajectory(TASK, loop.interaction_factory())

    async def walk():
        assert await pending(loop, trajectory) is State.GENERATING
        assert tok.decode(trajectory.ids).endswith("<|im_start|>assistant\n")
        assert '"name": "calculator"' in tok.decode(trajectory.ids)          # schemas in the system prompt
        assert await generating(loop, trajectory) is State.PROCESSING_TOOLS
        assert await processing_tools(loop, trajectory) is State.GENERATING
        assert await generating(loop, trajectory) is State.INTERACTING
        assert await interacting(loop, trajectory) is State.TERMINATED
    asyncio.run(walk())
    assert trajectory.stop_reason == "interaction" and trajectory.turns[-1].terminated
    assert trajectory.turns[0].info["tool_calls"][0]["content"] == "5"


class Verifier(MultiTurnScheduler):
    """Accepts "The answer is 5." and otherwise asks again; tells the reward function what it saw."""

    def step(self, trajectory, current_turn):
        return "Check your arithmetic.", {"verdict": "wrong", "turn": current_turn}

    def check_finished(self, trajectory, current_turn):
        return "The answer is 5." in trajectory.messages[-1]["content"] or super().check_finished(
            trajectory, current_turn)


@pytest.mark.parametrize("feedback", ["new_round", "continuation"])
def test_tool_episode_masks_and_merges_into_one_row(qwen_tokenizer, feedback):
    tok = qwen_tokenizer
    episode = run(scripted(tok, [call("calculator", expression="2+3"), "The answer is 5."], feedback=feedback))
    assert [t.info["stop_reason"] for t in episode.turns[1:]] == ["answered"]
    assert episode.metrics["stop_reason"] == "answered" and episode.metrics["tool_calls"] == 1
    first, second = episode.turns
    if feedback == "continuation":      # stopped at </tool_call>: no EOS, the result inside the message
        assert tok.eos_token_id not in first.response_ids
        assert tok.decode(second.prompt_ids).count("<|im_start|>assistant") == 1
    samples, report = merge_turns([episode], tokenizer=tok)
    assert report.rows == 1 and report.merged == 1
    (row,), (mask,) = samples.input_ids, samples.loss_mask
    assert row == second.prompt_ids + second.response_ids
    sampled = {len(first.prompt_ids) + i for i in range(len(first.response_ids))} | {
        len(second.prompt_ids) + i for i in range(len(second.response_ids))}
    assert [i for i, m in enumerate(mask) if m] == sorted(sampled)
    tool_output = tok.decode(row[len(first.prompt_ids) + len(first.response_ids): len(second.prompt_ids)])
    assert "<tool_response>\n5\n</tool_response>" in tool_output      # all of it at mask 0


@pytest.mark.parametrize("response,error,shown", [
    ("<tool_call>\n{not json}\n</tool_call>", "malformed", "Error: tool call is not valid JSON"),
    (call("nope"), "unknown_tool", "Error: unknown tool 'nope'"),
    (call("broken"), "exception", "Error: RuntimeError: disk on fire"),
    (call("slow", seconds=5), "timeout", "Error: slow timed out after 0.2 s"),
    (call("calculator", expr="1"), "bad_arguments", "Error: bad arguments for calculator"),
])
def test_tool_failures_become_messages_the_model_sees(qwen_tokenizer, response, error, shown):
    """Only the call meant to time out has a short limit: `broken` raises from a worker thread, which a loaded
    machine may start later than 0.2 s."""
    tok = qwen_tokenizer
    episode = run(scripted(tok, [response, "The answer is 5."], tool_timeout_s=0.2 if error == "timeout" else 60.0))
    first, second = episode.turns
    (record,) = first.info["tool_calls"]
    assert record["error"] == error and record["content"].startswith(shown)
    assert shown in tok.decode(second.prompt_ids[len(first.prompt_ids) + len(first.response_ids):])
    assert episode.metrics["tool_errors"] == 1 and first.valid_action == (error != "malformed")


def test_parallel_calls_and_token_truncation(qwen_tokenizer):
    tok = qwen_tokenizer
    response = call("slow", seconds=0.3) + "\n" + call("slow", seconds=0.3) + "\n" + call("shout", text="hey")
    loop = scripted(tok, [response, "The answer is 5."], max_parallel_calls=2, max_tool_response_tokens=10)
    episode = run(loop)
    records = episode.turns[0].info["tool_calls"]
    assert [r["content"] for r in records[:2]] == ["done", "done"]
    assert records[2]["content"].endswith("...[truncated 190 tokens]")
    assert len(tok.encode(records[2]["content"].split("\n...")[0])) == 10


def test_budgets_end_the_episode_with_their_reason(qwen_tokenizer):
    tok = qwen_tokenizer
    forever = [call("calculator", expression="1+1")] * 10
    episode = run(scripted(tok, forever, max_turns=3))
    assert episode.metrics["stop_reason"] == "max_turns" and len(episode.turns) == 3
    assert episode.turns[-1].truncated and not episode.turns[-1].terminated
    episode = run(scripted(tok, forever, max_total_tokens=60))
    assert episode.metrics["stop_reason"] == "max_total_tokens"
    assert len(episode.turns[-1].prompt_ids) - len(episode.turns[0].prompt_ids) < 60
    episode = run(AgentLoop(tok, CutEngine(), SamplingParams(max_tokens=8), tools=TOOLS))
    assert episode.metrics["stop_reason"] == "max_tokens" and len(episode.turns[0].response_ids) == 8


class CutEngine:
    """Always runs out of max_tokens."""

    async def generate(self, prompt_ids, params):
        return Generation([15] * params.max_tokens, [0.0] * params.max_tokens, "length")


def test_interaction_text_and_reward_enter_the_episode(qwen_tokenizer):
    tok = qwen_tokenizer

    class Tutor:
        async def start(self, task):
            self.hints = 0

        async def respond(self, trajectory):
            self.hints += 1
            if self.hints == 2:
                return Feedback(True, reward=1.0, info={"hints": self.hints})
            return Feedback(False, "Try again.", -0.5, {"hints": self.hints})

    episode = run(scripted(tok, ["7", "5"], tools={}, interaction_factory=Tutor))
    assert [t.reward for t in episode.turns] == [-0.5, 1.0] and episode.metrics["stop_reason"] == "interaction"
    assert [t.info["interaction"]["hints"] for t in episode.turns] == [1, 2]
    added = tok.decode(episode.turns[1].prompt_ids[len(episode.turns[0].prompt_ids):])
    assert added == "7<|im_end|>\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"


def test_scheduler_extra_info_reaches_the_reward_function(qwen_tokenizer):
    tok = qwen_tokenizer
    seen = []

    def reward_fn(episode):
        seen.append([t.info.get("interaction") for t in episode.turns])
        return float("The answer is 5." in episode.turns[-1].info["text"])

    loop = scripted(tok, ["The answer is 6.", "The answer is 5."] * 2, tools={},
                    interaction_factory=lambda: as_interaction(Verifier(max_turns=4)))
    collector = GroupCollector(AgentLoopTasks(loop, lambda seed: TASK, reward_fn), n_tasks=1, group_size=2)
    episodes = collector.collect()
    assert [e.outcome_reward for e in episodes] == [1.0, 1.0] and seen[0] == [{"verdict": "wrong", "turn": 1}, {}]
    assert all(e.group_id == "t/0" and e.metrics["success"] == 1.0 for e in episodes)


@pytest.mark.parametrize("feedback", ["new_round", "continuation"])
def test_arithmetic_task_with_its_teacher(qwen_tokenizer, feedback):
    tok = qwen_tokenizer
    tasks = [arithmetic.make_task(seed) for seed in range(8)]
    assert len({t.data["expression"] for t in tasks}) == 8 and arithmetic.make_task(3) == tasks[3]
    loop = AgentLoop(tok, ScriptedEngine(tok, arithmetic.teacher(tasks, mistake_rate=0.5, seed=1)),
                     SamplingParams(max_tokens=64), tools=tool_table([calculator]), feedback=feedback)
    collector = GroupCollector(AgentLoopTasks(loop, arithmetic.make_task, arithmetic.reward), n_tasks=8, group_size=1)
    episodes = collector.collect()
    rewards = [e.outcome_reward for e in episodes]
    assert set(rewards) == {0.0, 1.0}                       # the teacher's slips are caught by the reward
    for episode in episodes:
        stated = int(episode.turns[-1].info["text"].split()[-1].rstrip("."))
        assert episode.outcome_reward == float(stated == episode.data["answer"])
    _, report = merge_turns(episodes, tokenizer=tok)
    assert report.rows == 8 and report.merged == 8
