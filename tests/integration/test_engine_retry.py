"""Engine failures: transient ones are retried with back-off (same response, counted in the turn and the
metrics), persistent ones surface as one EngineError, bad requests are not retried."""

import asyncio
import logging

import pytest

from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.engines.retry import EngineError, generate_with_retry
from horizonrl.report.metrics import episode_metrics
from test_collector import make_collector  # tests/integration is on sys.path under pytest

PARAMS = SamplingParams(max_tokens=6, temperature=1.0, seed=7)


class DroppedReplies:
    """Fault injection around a real engine: the replies to its first `failures` calls are lost on
    the way back (the engine did the work; the caller sees a ConnectionError)."""

    def __init__(self, engine, failures: int):
        self.engine, self.failures, self.calls = engine, failures, 0

    async def generate(self, prompt_ids, params):
        self.calls += 1
        call = self.calls
        generation = await self.engine.generate(prompt_ids, params)
        if call <= self.failures:
            raise ConnectionError(f"connection reset by peer (call {call})")
        return generation

    def __getattr__(self, name):     # the rest of the engine: sync_weights, sleep, state_dict, close...
        return getattr(self.engine, name)


def prompt(tokenizer):
    return tokenizer.encode("You are on stone 2 of 5. The next stone is to your right.")


def test_recovers_after_two_failures_with_the_response_of_a_run_without_them(river_tiny, caplog):
    tokenizer, model = river_tiny
    ids = prompt(tokenizer)
    clean = asyncio.run(HFEngine(model, tokenizer.pad_token_id, seed=1).generate(ids, PARAMS))
    flaky = DroppedReplies(HFEngine(model, tokenizer.pad_token_id, seed=1), failures=2)
    with caplog.at_level(logging.WARNING, logger="horizonrl.engines.retry"):
        generation, retries = asyncio.run(generate_with_retry(flaky, ids, PARAMS, attempts=3, backoff_s=(0.01,)))
    assert generation == clean and retries == 2 and flaky.calls == 3
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [
        "engine call failed (attempt 1 of 3", "engine call failed (attempt 2 of 3"]


def test_gives_up_after_the_last_attempt_with_one_clear_error(river_tiny):
    tokenizer, model = river_tiny
    ids = prompt(tokenizer)
    flaky = DroppedReplies(HFEngine(model, tokenizer.pad_token_id), failures=10)
    with pytest.raises(EngineError) as error:
        asyncio.run(generate_with_retry(flaky, ids, PARAMS, attempts=3, backoff_s=(0.01,)))
    assert str(error.value) == (f"the engine failed 3 times in a row on a request with a {len(ids)}-token prompt "
                                "(max_tokens 6); last error: ConnectionError: connection reset by peer (call 3)")
    assert flaky.calls == 3 and isinstance(error.value.__cause__, ConnectionError)


def test_bad_requests_are_not_retried(river_tiny):
    tokenizer, model = river_tiny
    engine = DroppedReplies(HFEngine(model, tokenizer.pad_token_id), failures=0)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        asyncio.run(generate_with_retry(engine, [], PARAMS, attempts=3, backoff_s=(0.01,)))
    too_big = [len(tokenizer) + 5]     # an id the model cannot embed: IndexError, as every time
    with pytest.raises(IndexError):
        asyncio.run(generate_with_retry(engine, too_big, PARAMS, attempts=3, backoff_s=(0.01,)))
    assert engine.calls == 2


def test_collected_turns_count_their_retries_and_match_a_run_without_failures(river_tiny):
    """The collectors retry with the default back-off (0.5 s before the one retry here)."""
    tokenizer, model = river_tiny
    clean = make_collector(tokenizer, HFEngine(model, tokenizer.pad_token_id, seed=3), n_env=2, e_len=2).collect()
    flaky = DroppedReplies(HFEngine(model, tokenizer.pad_token_id, seed=3), failures=1)
    episodes = make_collector(tokenizer, flaky, n_env=2, e_len=2).collect()
    turns = [t for e in episodes for t in e.turns]
    assert [t.response_ids for t in turns] == [t.response_ids for e in clean for t in e.turns]
    assert sum(t.info.get("engine_retries", 0) for t in turns) == 1
    assert episode_metrics(episodes)["rollout/engine_retries"] == 1
    assert episode_metrics(clean)["rollout/engine_retries"] == 0


def test_train_command_reports_a_persistent_engine_failure_in_one_line(tmp_path, monkeypatch, capsys):
    from horizonrl.cli import main
    from horizonrl.config import SOURCE_CONFIGS
    from horizonrl.engines import retry
    from horizonrl.assembly import context

    make_engine = context.make_engine
    monkeypatch.setattr(context, "make_engine", lambda *args: DroppedReplies(make_engine(*args), failures=10**6))
    monkeypatch.setattr(retry.generate_with_retry, "__defaults__", (retry.ATTEMPTS, (0.0,)))   # no waits
    assert main(["train", str(SOURCE_CONFIGS / "toy.yaml"), "rollout.n_env=2", "optim.mini_batch_size=16",
                 "model.warm_start.steps=1", "model.warm_start.iterations=1", f"output_dir={tmp_path}",
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "horizonrl: the engine failed 4 times in a row on a request" in err and "Traceback" not in err
