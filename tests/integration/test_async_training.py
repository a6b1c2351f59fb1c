"""Asynchronous training (rollout.async_training.max_staleness = K, rollout/producer.py) on real envs with the
hf engine: no trained turn is older than K weight versions, across a `--resume`; the bound is reached (the
producer does run ahead); the engine takes new weights while a rollout is in flight; the group algorithms
and the gateway's agents run under it; and a config that cannot be corrected off-policy is refused
(the vllm and openai engines: tests/with_vllm).

The staleness is checked here independently of the producer's own check: at iteration i >= 1 the policy being
updated has had i - 1 updates (the critic warmup updates no actor), so every turn trained at iteration i must
have been sampled by weights version i - 1 - K or newer, whatever the engine's counter says after a resume.
"""

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from horizonrl import envs
from horizonrl.cli import main
from horizonrl.config import ConfigError, load_config
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.scoring import token_logprobs
from horizonrl.records import Turn
from horizonrl.train import phases, ppo
from horizonrl.runstate.checkpoint import StopSignals
from horizonrl.assembly.context import start_run

TOY = "configs/toy.yaml"
SMALL = ["rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.micro_batch_size=8",
         "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start.steps=20",
         "model.warm_start.iterations=1", "actor.tis_cap=2.0"]
STEPS_PER_BATCH = 4 * 4     # SMALL's rollout.n_env x ppo.e_len: a fixed-turn batch's env steps

envs.register("producer-steps-river", "flaky_envs:ProducerStepsRiver", "a River that logs the steps a producer plays")


@pytest.fixture
def trained_versions(monkeypatch):
    """iteration -> (the engine's version when the batch is scored, the weights version of every trained turn)."""
    seen, iteration = {}, [None]
    iterate, score = ppo.ppo_iteration, phases.score

    def ppo_iteration(ctx, i):
        iteration[0] = i
        return iterate(ctx, i)

    def scored(ctx, episodes, critic, updates_actor=True):
        if updates_actor:
            seen[iteration[0]] = (ctx.engine.state_dict()["weights_version"],
                                  [t.info["weights_version"] for e in episodes for t in e.turns])
        return score(ctx, episodes, critic, updates_actor)

    monkeypatch.setattr(ppo, "ppo_iteration", ppo_iteration)
    monkeypatch.setattr(phases, "score", scored)
    return seen


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def learner_waits_for_the_producer_to_run_ahead(monkeypatch, steps_file: Path, max_staleness: int) -> list[str]:
    """Overrides for a run of producer-steps-river whose learner, before each weight sync of an update, waits until
    its producer has begun the batch K ahead of the last one taken (the producer's env steps, logged in
    `steps_file`, say how far it has got): the first turns of that batch are then sampled K versions before the
    policy that trains it, so the bound is reached however fast the update is next to a batch. (The wait's 60 s
    bound only turns a producer that does not run ahead into a failure.)"""
    runs: list[list] = []        # [collector, producer steps logged before its first batch, batches taken]
    collect_turns, sync_engine = ppo.collect_turns, phases.sync_engine

    def steps() -> int:
        return len(steps_file.read_text().splitlines()) if steps_file.exists() else 0

    def counted_collect_turns(ctx):
        run = next((run for run in runs if run[0] is ctx.collector), None)
        if run is None:
            runs.append(run := [ctx.collector, steps(), 0])      # before its producer starts
        run[2] += 1
        return collect_turns(ctx)

    def sync_once_ahead(ctx):
        _, before, taken = next(run for run in runs if run[0] is ctx.collector)
        deadline = time.monotonic() + 60
        while steps() - before <= STEPS_PER_BATCH * (taken + max_staleness - 1):   # batch taken + K not begun
            assert time.monotonic() < deadline, "the producer did not run ahead"
            time.sleep(0.01)
        return sync_engine(ctx)

    monkeypatch.setattr(ppo, "collect_turns", counted_collect_turns)
    monkeypatch.setattr(phases, "sync_engine", sync_once_ahead)
    return ["env.id=producer-steps-river", f"env.kwargs.steps_file={steps_file}"]


@pytest.mark.parametrize("max_staleness, producer", [(1, "thread"), (2, "thread"), (2, "process")])
def test_no_trained_turn_is_older_than_the_bound_across_a_resume(tmp_path, trained_versions, max_staleness, producer,
                                                                 monkeypatch):
    async_training = [f"rollout.async_training.max_staleness={max_staleness}",
                      f"rollout.async_training.producer={producer}"]
    ahead = learner_waits_for_the_producer_to_run_ahead(monkeypatch, tmp_path / "producer-steps", max_staleness)
    runs = tmp_path / "runs"
    assert main(["train", TOY, *SMALL, *async_training, *ahead, "iterations=3", f"output_dir={runs}", "--quiet"]) == 0
    (run,) = runs.iterdir()
    assert main(["train", "--resume", str(run), "iterations=6", "--quiet"]) == 0
    assert sorted(trained_versions) == [1, 2, 3, 4, 5, 6]
    staleness = {}
    for i, (engine_version, turn_versions) in trained_versions.items():
        assert engine_version == i - 1                           # restored with the checkpoint
        assert len(turn_versions) == 16                          # 4 streams x 4 turns
        assert min(turn_versions) >= i - 1 - max_staleness and max(turn_versions) <= i - 1
        staleness[i] = i - 1 - min(turn_versions)
    assert max(staleness.values()) == max_staleness             # the producer runs ahead (the learner waits for it)
    assert staleness[4] == 0                                     # the resumed run collects its first batch afresh
    records = [r for r in metrics(run) if r["iteration"] > 0]
    assert [r["async/staleness_max"] for r in records] == [staleness[i] for i in range(1, 7)]
    for r in records:
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"]
        assert r["async/producer_wait_s"] >= 0 and r["async/learner_wait_s"] >= 0
        assert r["async/turns_in_flight_at_sync"] >= 0 and r["rollout/tis_weight_mean"] > 0
        # the share of tokens sampled by the weights being trained: all of them exactly when no turn is stale
        assert (r["rollout/current_weights_frac"] == 1.0) == (r["async/staleness_max"] == 0)


def test_gigpo_trains_asynchronously(tmp_path):
    assert main(["train", TOY, *SMALL, "algorithm=gigpo", "group.n_tasks=2", "group.group_size=4",
                 "group.max_turns=4", "rollout.async_training.max_staleness=1", "iterations=3",
                 f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    records = metrics(run)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1 and r["gigpo/anchored_step_frac"] > 0 for r in records)
    assert (run / "checkpoint" / "model.safetensors").exists()


@pytest.mark.parametrize("producer", ["thread", "process"])
def test_the_gateways_agents_train_asynchronously(tmp_path, producer):
    assert main(["train", "configs/arithmetic_openai_agent.yaml", "group.n_tasks=2", "group.group_size=4",
                 "model.warm_start.steps=30", "model.warm_start.iterations=1", "device=cpu", "actor.tis_cap=2.0",
                 "rollout.async_training.max_staleness=1", f"rollout.async_training.producer={producer}",
                 "iterations=2", f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    records = metrics(run)
    assert [r["env/errors"] == 0 and r["async/staleness_max"] <= 1 for r in records] == [True, True]
    # the gateway's counts are those made between two batches taken: batch 2's calls may fall in batch 1's time
    assert sum(r["gateway/requests"] for r in records) >= sum(r["env/turns"] for r in records)


@pytest.mark.parametrize("algorithm, producer", [("grpo", "thread"), ("grpo", "process"), ("ppo", "thread")])
def test_a_run_whose_env_resets_fail_ends_naming_the_failure(tmp_path, spawn, algorithm, producer):
    """The toy (seed 1, training seeds from 1_000_003) with env workers, K = 1, whose env's resets fail from the
    run's 9th training seed: batch 2 of GRPO (2 tasks a batch, 4 rollouts each at 4 env handles), a stream's 3rd
    episode of PPO. Its reset fails 3 times in a row, which stops the run: the run ends with that error, while
    the producer runs ahead or waits at its gate. (The 600 s bound only turns a hang into a failure.)"""
    fail_from, fail_below = 1_000_003 + 8, 2_000_006
    script = (f"import sys\n"
              f"from horizonrl import envs\n"
              f"from horizonrl.cli import main\n"
              f"envs.register('reset-fails-river', 'flaky_envs:ResetFailsRiver', fail_from={fail_from}, "
              f"fail_below={fail_below})\n"
              f"sys.exit(main(sys.argv[1:]))\n")
    groups = ["group.n_tasks=2", "group.group_size=4", "group.max_turns=4"] if algorithm == "grpo" else []
    process = spawn([sys.executable, "-c", script, "train", TOY, *SMALL, f"algorithm={algorithm}", *groups,
                     "env.id=reset-fails-river", "env.workers=true", "rollout.async_training.max_staleness=1",
                     f"rollout.async_training.producer={producer}", "iterations=20", f"output_dir={tmp_path}",
                     "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                    env=dict(os.environ, OMP_NUM_THREADS="1",
                             PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                         os.environ.get("PYTHONPATH", "")])))
    output, _ = process.communicate(timeout=600)
    assert process.returncode != 0, output[-3000:]
    assert "reset failed 3 times in a row" in output and "the simulator refused seed" in output, output[-3000:]


def test_a_config_that_cannot_train_off_policy_is_refused():
    with pytest.raises(ConfigError, match="set actor.tis_cap"):
        load_config(TOY, ["rollout.async_training.max_staleness=1"])
    with pytest.raises(ConfigError, match="rollout.async_training.producer.*openai engine already generates"):
        load_config(TOY, ["rollout.async_training.max_staleness=1", "actor.tis_cap=2.0", "rollout.engine=openai",
                          "rollout.async_training.producer=process"])


@pytest.fixture
def process_run(tmp_path):
    """A toy run's context whose producer is a process (K = 1); closed after the test."""
    cfg = load_config(TOY, [*SMALL, "rollout.async_training.max_staleness=1", "rollout.async_training.producer=process",
                            f"output_dir={tmp_path}"])
    with StopSignals() as signals:
        ctx = start_run(cfg, [], signals, None)
    yield ctx
    ctx.collector.close()


def learner_logprobs(actor, turn: Turn) -> list[float]:
    """The actor's log-prob of each of the turn's response tokens (temperature 1, the toy's)."""
    ids = torch.tensor([turn.prompt_ids + turn.response_ids])
    sampled = torch.zeros_like(ids)
    sampled[0, len(turn.prompt_ids):] = 1
    logp, _ = token_logprobs(actor, ids, torch.ones_like(ids), sampled)
    return logp[0, len(turn.prompt_ids):].tolist()


def test_a_producer_process_samples_from_the_weights_synced_to_it(process_run):
    """After a sync, turns the producer process samples under the new version have the updated actor's log-probs
    (to float rounding); the turns it sampled before have the old weights' (the change is large enough to see)."""
    ctx = process_run
    old_turns = [t for e in ctx.collector.collect() for t in e.turns]
    with torch.no_grad():
        for parameter in ctx.actor.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    ctx.engine.sync_weights(ctx.actor)
    assert ctx.engine.state_dict() == {"weights_version": 1}
    new_turns = []
    while len(new_turns) < 8:          # batch 2 may have started under version 0 (K = 1); batch 3 did not
        new_turns += [t for e in ctx.collector.collect() for t in e.turns if t.info["weights_version"] == 1]
    for turn in new_turns:
        assert learner_logprobs(ctx.actor, turn) == pytest.approx(turn.response_logprobs, abs=1e-4)
    moved = [max(abs(a - b) for a, b in zip(learner_logprobs(ctx.actor, t), t.response_logprobs)) for t in old_turns]
    assert max(moved) > 0.1


def test_a_producer_process_error_reaches_the_learner(process_run):
    """An error raised in the producer process is raised in the learner's as itself; a producer process that died
    is a RuntimeError saying so at the next message, never a hang."""
    producer = process_run.collector
    assert len(producer.collect()) == 4
    with pytest.raises(RuntimeError, match="the producer is running: load the collector's state before"):
        producer.load_state_dict(producer.state_dict())
    producer._process.kill()
    producer._process.join()
    with pytest.raises(RuntimeError, match=r"the producer process ended \(exit code -9\) while the learner asked it "
                                           "to collect"):
        producer.collect()


def test_a_run_that_fails_before_closing_its_producer_process_still_exits(tmp_path):
    """A producer process left running by an error (here: a run that exits without closing its collector) ends with
    the learner's process instead of holding its exit."""
    overrides = [*SMALL, "rollout.async_training.max_staleness=1", "rollout.async_training.producer=process",
                 f"output_dir={tmp_path}"]
    script = (f"from horizonrl.config import load_config\n"
              f"from horizonrl.runstate.checkpoint import StopSignals\n"
              f"from horizonrl.assembly.context import start_run\n"
              f"with StopSignals() as signals:\n"
              f"    ctx = start_run(load_config({TOY!r}, {overrides!r}), [], signals, None)\n"
              f"ctx.collector.collect()\n"
              f"raise SystemExit(3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]


def test_a_sigterm_to_the_process_group_stops_a_producer_process_run_with_a_checkpoint(tmp_path, spawn):
    """SIGTERM sent to the whole process group (a scheduler's) reaches the producer process too: it ignores it, and
    the learner's process stops the run at the next iteration boundary with a checkpoint, from which it resumes.
    (`spawn` kills the group when a wait fails: a 500-iteration run must not be left behind.)"""
    run_dir = tmp_path / "runs"
    process = spawn([sys.executable, "-m", "horizonrl", "train", TOY, *SMALL, "iterations=500", "save_every=0",
                     "rollout.async_training.max_staleness=1", "rollout.async_training.producer=process",
                     f"output_dir={run_dir}", "--quiet"], stderr=subprocess.PIPE, text=True,
                    env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(run_dir.glob("*/metrics.jsonl")) or len(metrics(next(run_dir.iterdir()))) < 2:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr[-3000:]
    (run,) = run_dir.iterdir()
    (saved,) = (run / "checkpoints").iterdir()
    stopped_at = int(saved.name.removeprefix("iter_"))
    assert main(["train", "--resume", str(run), f"iterations={stopped_at + 2}", "--quiet"]) == 0
    assert [r["iteration"] for r in metrics(run)][-2:] == [stopped_at + 1, stopped_at + 2]


def test_the_hf_engine_takes_new_weights_while_a_request_is_in_flight(river_tiny):
    """A request running across `sync_weights` ends (it keeps the version it started under, and its KV is not
    kept for later prompts); a request after it gets the new version and samples from the new weights: greedy
    decoding gives what an engine over the new weights alone gives, not what the old weights gave."""
    tokenizer, model = river_tiny
    engine = HFEngine(copy.deepcopy(model), tokenizer.pad_token_id)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in new.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=0.5)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    long = SamplingParams(max_tokens=200, temperature=0.0)
    prompt = tokenizer.encode("The river runs")
    before = engine.generate_batch([prompt], [greedy])[0]
    paused, synced = threading.Event(), threading.Event()
    admit = engine._admit

    def admit_after_the_sync(batch):       # between two decode steps, 100 tokens in, the worker waits for the sync
        if batch is not None and len(batch.requests[0].token_ids) == 100:
            paused.set()
            assert synced.wait(timeout=60)
        return admit(batch)

    engine._admit = admit_after_the_sync

    async def sync_during_a_rollout():
        running = asyncio.create_task(engine.generate(prompt, long))
        assert await asyncio.to_thread(paused.wait, 60)   # the request is in flight, half of it sampled
        await asyncio.to_thread(engine.sync_weights, new)
        synced.set()
        in_flight = await running
        kept = list(engine._prefixes)
        return in_flight, kept, await engine.generate(prompt, greedy)

    in_flight, kept, after = asyncio.run(sync_during_a_rollout())
    assert engine.in_flight_at_sync == 1
    assert len(in_flight.token_ids) == 200 and in_flight.weights_version == 0
    assert kept == []                                     # its KV, computed partly by the old weights, is not kept
    assert after.weights_version == 1
    fresh = HFEngine(new, tokenizer.pad_token_id).generate_batch([prompt], [greedy])[0]
    assert after.token_ids == fresh.token_ids != before.token_ids
