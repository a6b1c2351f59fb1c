"""Fixed-turn collection: persistent streams, episodes spanning iterations, bootstrap prompts."""

import pytest

from horizonrl.agents.agent import Agent
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.engines.scripted import RandomFormatEngine
from horizonrl.envs.pool import InProcessEnv, open_envs
from horizonrl.learner.models import stop_ids
from horizonrl.rollout.fixed_turn import FixedTurnCollector


def make_collector(tokenizer, engine, n_env=3, e_len=4, max_steps=6, memory=1):
    streams = open_envs("river", {"stones": 2, "max_steps": max_steps}, n_env, workers=False, timeout_s=10)
    return FixedTurnCollector(streams, Agent(tokenizer, memory=memory), engine,
                              SamplingParams(max_tokens=16), e_len, seed=5)


def test_turn_count_spanning_episodes_and_bootstrap_prompts(river_tiny):
    tokenizer, _ = river_tiny
    engine = RandomFormatEngine(tokenizer, ["jump left", "jump right", "wait"], seed=0)
    collector = make_collector(tokenizer, engine)
    first = collector.collect()
    second = collector.collect()
    for batch in (first, second):
        assert sum(len(e.turns) for e in batch) == 3 * 4
        for e in batch:
            last = e.turns[-1]
            assert (e.bootstrap_prompt_ids is None) == last.terminated
            if not e.finished:
                assert e.metrics == {}
    # A fragment cut at the end of the first batch continues in the second with the same id, and its
    # bootstrap prompt is exactly the prompt of the next turn.
    continued = 0
    for stream in range(3):
        cut = [e for e in first if e.episode_id.endswith(f"seed{5 * 1_000_003 + stream}") and not e.finished]
        if cut:
            (nxt,) = [e for e in second if e.episode_id == cut[0].episode_id]
            assert nxt.turns[0].prompt_ids == cut[0].bootstrap_prompt_ids
            continued += 1
    assert continued >= 1


def test_truncation_closes_the_episode_with_a_final_observation_prompt(river_tiny):
    tokenizer, _ = river_tiny
    engine = RandomFormatEngine(tokenizer, ["wait"], seed=0)      # never crosses
    collector = make_collector(tokenizer, engine, n_env=1, e_len=8, max_steps=3)
    batch = collector.collect()
    assert [len(e.turns) for e in batch] == [3, 3, 2]
    truncated = batch[0]
    assert truncated.finished and truncated.turns[-1].truncated and not truncated.turns[-1].terminated
    assert truncated.metrics == {"return": 0.0, "length": 3, "success": 0.0, "invalid_actions": 0}
    assert tokenizer.decode(truncated.bootstrap_prompt_ids).count("Current Observation:") == 1
    assert batch[1].episode_id != batch[0].episode_id


def test_invalid_output_runs_default_action_with_penalty_and_history_shows_it(river_tiny):
    tokenizer, model = river_tiny                       # untrained: emits no valid action
    engine = HFEngine(model, tokenizer.pad_token_id, seed=0)
    collector = FixedTurnCollector([InProcessEnv("river", {})], Agent(tokenizer, invalid_penalty=-0.25),
                                   engine, SamplingParams(max_tokens=8, stop_ids=stop_ids(tokenizer, model)), 2)
    (episode,) = collector.collect()
    first, second = episode.turns
    assert not first.valid_action and first.action == "wait" and first.reward == pytest.approx(-0.25)
    assert "invalid_output" in first.info and first.response_logprobs is not None
    assert len(first.response_logprobs) == len(first.response_ids)
    prompt = tokenizer.decode(second.prompt_ids)
    assert "Previous plan:\nTHINK: " in prompt and prompt.split("Previous plan:\n")[1].split("<|im_end|>")[0].endswith(
        "ACTION: wait")
    # Token-in, token-out: the second prompt extends nothing it re-tokenised; the first response ids are kept.
    assert first.prompt_ids == tokenizer.apply_chat_template(
        _first_messages(collector), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def _first_messages(collector):
    from horizonrl.agents.prompt import build_messages, system_prompt

    stream = collector.streams[0]
    obs, _ = stream.env.env.reset(stream.seed)   # the env inside the in-process handle
    return build_messages(system_prompt(stream.env.instruction), [], obs, 1)
