"""What the gateway keeps and counts per rollout, through a group of agents we did not write (GatewayAgents):
the Responses conversations of every live rollout, however many there are, until the rollout is collected; and
the requests of agents that send a fixed seed, which make a group's rollouts identical."""

import asyncio
import logging

import openai
import torch
from openai import AsyncOpenAI

from integration.test_agent_groups import collector, warnings

from horizonrl.engines.hf import HFEngine
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway.responses_api import ResponseStore
from horizonrl.learner.models import load_policy
from horizonrl.tasks import arithmetic

MESSAGES = [{"role": "user", "content": "Problem: 1 + 1"}]


def refusal(client: openai.OpenAI, response_id: str) -> openai.BadRequestError | None:
    """The error of a request that continues `response_id` (None: it was served)."""
    try:
        client.responses.create(model="policy", previous_response_id=response_id, input="Check again.")
    except openai.BadRequestError as error:
        return error
    return None


def test_a_rollouts_responses_outlive_those_of_more_rollouts_than_the_capacity_until_it_is_collected(qwen_tokenizer):
    """6 rollouts (3 tasks x 2) each store a response, with room for 2 responses of no rollout; once all 6 have,
    each continues its own conversation by previous_response_id. Collected, their responses are gone: a request
    that continues one is refused, naming the response and why."""
    rollouts, first_ids, urls, all_stored = 6, [], [], asyncio.Event()

    async def agent(task: dict, base_url: str) -> float:
        problem = f"{task['messages'][-1]['content']} ({base_url})"     # each rollout's own first input
        async with AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0) as client:
            first = await client.responses.create(model="policy", input=problem)
            first_ids.append(first.id)
            urls.append(base_url.split("/rollouts/")[0])
            if len(first_ids) == rollouts:
                all_stored.set()
            await all_stored.wait()
            await client.responses.create(model="policy", previous_response_id=first.id, input="Check again.")
        return 1.0

    engine = ScriptedEngine(qwen_tokenizer, lambda prompt: "The answer is 2.")
    groups = collector(qwen_tokenizer, agent, [arithmetic.make_task(seed) for seed in range(3)], engine=engine)
    groups.player.gateway.responses = ResponseStore(capacity=2)
    try:
        episodes = groups.collect()
        plain = openai.OpenAI(base_url=f"{urls[0]}/v1", api_key="-", max_retries=0)
        refusals = [refusal(plain, response_id) for response_id in first_ids]
    finally:
        groups.close()
    assert groups.errors == [] and len(episodes) == rollouts
    assert len({tuple(e.turns[0].prompt_ids) for e in episodes}) == rollouts       # each its own first input
    for episode in episodes:                                        # and then its own conversation, continued
        first, second = episode.turns
        assert second.prompt_ids[:len(first.prompt_ids) + len(first.response_ids)] == (first.prompt_ids +
                                                                                        first.response_ids)
    for response_id, refused in zip(first_ids, refusals):
        assert refused is not None and refused.status_code == 400 and refused.body["param"] == "previous_response_id"
        assert refused.body["message"].startswith(f"previous_response_id: no stored response {response_id!r}: "
                                                  "this gateway keeps a rollout's responses until the rollout is "
                                                  "collected")


def test_agents_that_send_a_fixed_seed_sample_identical_groups_counted_and_told_once(caplog):
    """2 tasks x 4 agents, each sending seed=42, from the tiny policy at temperature 1: the 4 rollouts of a task
    sample the same response; 3 of each 4 repeat an earlier request (6 a batch; the two tasks' prompts differ, so
    their shared seed is no repeat). The weights change between the two batches: the second counts 6 again. One
    warning for the run. On the plain routes a fixed seed is a client's ask for the same answer: not counted."""
    urls = []

    async def sends_seed_42(task: dict, base_url: str) -> float:
        urls.append(base_url.split("/rollouts/")[0])
        async with AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0) as client:
            await client.chat.completions.create(model="policy", messages=task["messages"], max_tokens=16, seed=42)
        return 1.0

    tokenizer, model = load_policy("builtin:babyai-tiny", torch.device("cpu"))
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer)
    groups = collector(tokenizer, sends_seed_42, [arithmetic.make_task(seed) for seed in range(2)], group_size=4,
                       engine=engine)
    batches = []
    try:
        with caplog.at_level(logging.WARNING, logger="horizonrl"):
            for _ in range(2):
                batches.append((groups.collect(), groups.errors, groups.counts))
                engine.sync_weights(model)
            plain = openai.OpenAI(base_url=f"{urls[0]}/v1", api_key="-", max_retries=0)
            for _ in range(2):
                plain.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4, seed=42)
            plain_repeats = groups.player.counters()["gateway/fixed_seed_repeats"] - 12
    finally:
        groups.close()
    for episodes, errors, counts in batches:
        assert errors == [] and len(episodes) == 8
        for group in (episodes[:4], episodes[4:]):
            assert len({tuple(e.turns[0].response_ids) for e in group}) == 1
        assert counts["gateway/fixed_seed_repeats"] == 6
    assert plain_repeats == 0
    (warning,) = warnings(caplog)
    assert "fixed seed (seed=42)" in warning and "group advantages zero" in warning
    assert "drop `seed` from the agent's requests" in warning
