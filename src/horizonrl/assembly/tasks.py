"""Agent-loop tasks in a training job: the objects a `task:` config section names, and the tiny
model's tokenizer and warm start for a task.

The tiny model learns the task's format from its teacher (a "module:function" that takes the tasks
and returns a responder, prompt text -> response text): the tokenizer is trained on the text of
teacher conversations rendered through the chat template, and the warm start fine-tunes on teacher
episodes collected through the real agent loop, so its prompts are exactly those RL will use. A
`task.agent` (an OpenAI-API agent of the user's) plays the teacher's episodes itself, through a gateway
over the teacher, so the warm start sees exactly the prompts the agent's calls render.

The teacher's tasks are played a training batch's worth at a time (group.n_tasks x group.group_size), and
`check` is called before each batch and each fine-tuning step: it raises to stop the warm start (a stop
signal, runstate/checkpoint.py StopSignals), so that a stop comes within one batch or step. The teacher answers
every call, so an agent whose first batch all fails fails on its own (or its requests do): RolloutsFailed
ends the warm start there, naming the causes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from horizonrl.config import TrainConfig
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway.agent_groups import GatewayAgents, RunSampling
from horizonrl.gateway.recorder import Recorder
from horizonrl.gateway.server import Gateway
from horizonrl.learner.sft import supervised_finetune
from horizonrl.learner.tokenizer import train_bpe_tokenizer
from horizonrl.records import Episode, Task
from horizonrl.rollout.agent_loop import AgentLoop
from horizonrl.rollout.episode_groups import load_reward_fn
from horizonrl.rollout.failures import raise_if_none_succeeded
from horizonrl.rollout.groups import GroupCollector
from horizonrl.rollout.interaction import as_interaction
from horizonrl.rollout.task_groups import AgentLoopTasks
from horizonrl.samples.per_turn import per_turn
from horizonrl.tools.registry import import_target, tools_from_references
from horizonrl.assembly.warm_start import build_tiny

log = logging.getLogger(__name__)
TEACHER_CONTEXT = 1 << 20  # the teacher has no context limit
CORPUS_TASKS = 256        # tasks whose teacher conversations train the tiny tokenizer
DEMO_SEED = 10_000_019    # warm-start tasks come from seeds far from the training seeds


def make_agent_loop(cfg: TrainConfig, tokenizer, engine: Engine, params: SamplingParams) -> AgentLoop:
    task = cfg.task
    interaction_factory = None
    if task.interaction is not None:
        provider = import_target(task.interaction)
        interaction_factory = lambda: as_interaction(provider())  # noqa: E731  one per episode
    return AgentLoop(tokenizer, engine, params, tools_from_references(task.tools), interaction_factory,
                     task.feedback, cfg.group.max_turns, task.max_total_tokens, task.max_parallel_calls,
                     task.tool_timeout_s, task.max_tool_response_tokens)


def task_collector(cfg: TrainConfig, tokenizer, engine: Engine, params: SamplingParams, context_len: int,
                   share: range | None = None) -> GroupCollector:
    """The agent loop's collector, or with `task.agent` the user's agent's, through a gateway over `engine`."""
    if cfg.task.agent is not None:
        return agent_collector(cfg, tokenizer, engine, params, context_len, cfg.group.group_size, share)
    tasks = AgentLoopTasks(make_agent_loop(cfg, tokenizer, engine, params), import_target(cfg.task.source),
                           load_reward_fn(cfg.group.reward_fn))
    return GroupCollector(tasks, cfg.group.n_tasks, cfg.group.group_size, cfg.seed, share)


# Constrained decoding (a forced tool call, a JSON response format) samples from the policy renormalised over the
# tokens the grammar allows: its log-probs are the engine's, not the learner's full-softmax ones. Truncated
# importance sampling weights each token by min(exp(logp_old - logp_engine), cap) = the allowed mass Z <= 1,
# which turns the sampled tokens' gradient into the unconstrained policy's (tests/unit/test_constrained_tis.py).
CONSTRAINTS_NEED_TIS = ("constrained decoding (a forced tool call or a JSON response format) samples from the "
                        "policy renormalised over what the grammar allows, which the learner corrects only by "
                        "truncated importance sampling: set actor.tis_cap (e.g. actor.tis_cap=2) to train on it")


def agent_collector(cfg: TrainConfig, tokenizer, engine: Engine, params: SamplingParams, context_len: int,
                    group_size: int, share: range | None = None) -> GroupCollector:
    """`task.agent` played through a gateway (on a free local port) that samples at the run's temperature and
    top_p (whatever the agent asks: the learner scores at them) and gives at most `params.max_tokens` per call
    (a request for more is capped, not refused). Without `actor.tis_cap` it refuses requests that need
    constrained decoding, in the warm start too (whose teacher would answer them), so that such an agent fails at
    its first call rather than after the warm start was paid for."""
    constraint_refusal = None if cfg.actor.tis_cap is not None else CONSTRAINTS_NEED_TIS
    sampler = RunSampling(engine, params.temperature, params.top_p)
    gateway = Gateway(sampler, tokenizer, cfg.model.path or cfg.name, context_len, params.stop_ids,
                      Recorder(issued_only=True), max_tokens_limit=params.max_tokens, max_n=1, cap_max_tokens=True,
                      constraint_refusal=constraint_refusal)
    reward_fn = None if cfg.group.reward_fn is None else load_reward_fn(cfg.group.reward_fn)
    agents = GatewayAgents(import_target(cfg.task.agent), import_target(cfg.task.source), gateway, reward_fn,
                           cfg.task.agent_timeout_s, tuple(cfg.task.agents))
    return GroupCollector(agents, cfg.group.n_tasks, group_size, cfg.seed, share)


def demo_tasks(cfg: TrainConfig, n_tasks: int) -> list[Task]:
    """The first `n_tasks` tasks of the teacher's seed range."""
    make_task = import_target(cfg.task.source)
    return [make_task(DEMO_SEED + seed) for seed in range(n_tasks)]


def teacher_episodes(cfg: TrainConfig, tokenizer, tasks: list[Task], check: Callable[[], None]) -> list[Episode]:
    """The teacher's episodes on `tasks`, through the real agent loop (or the run's own agent and gateway; the
    episodes its agent fails are left out), a training batch's worth of tasks at a time, `check()` before
    each batch."""
    engine = ScriptedEngine(tokenizer, import_target(cfg.task.teacher)(tasks))
    params = SamplingParams(max_tokens=cfg.rollout.max_tokens, stop_ids=(tokenizer.eos_token_id,))
    if cfg.task.agent is None:
        loop = make_agent_loop(cfg, tokenizer, engine, params)
        return in_batches(cfg, tasks, check, lambda batch: asyncio.run(_run_all(loop, batch)))
    collector = agent_collector(cfg, tokenizer, engine, params, TEACHER_CONTEXT, group_size=1)
    try:
        return in_batches(cfg, tasks, check, collector.run)
    finally:
        collector.close()


def in_batches(cfg: TrainConfig, tasks: list[Task], check: Callable[[], None],
               play: Callable[[list[Task]], list[Episode]]) -> list[Episode]:
    """The episodes `play` gives on `tasks`, group.n_tasks x group.group_size tasks at a time, `check()` before
    each batch; those that failed (metrics["error"]) left out. A first batch in which all failed raises
    RolloutsFailed."""
    size = cfg.group.n_tasks * cfg.group.group_size
    kept: list[Episode] = []
    for start in range(0, len(tasks), size):
        check()
        played = play(tasks[start:start + size])
        kept += [episode for episode in played if "error" not in episode.metrics]
        raise_if_none_succeeded(len(kept), len(played), [e.metrics["error"] for e in played if "error" in e.metrics],
                                "teacher rollout of the warm start's first batch", "there is nothing to learn from "
                                "(the scripted teacher answered every call: the agent fails on its own, or its "
                                "requests do); nothing was saved")
    return kept


async def _run_all(loop: AgentLoop, tasks) -> list[Episode]:
    return list(await asyncio.gather(*(loop.run(task, task.task_id) for task in tasks)))


def build_tiny_for_task(cfg: TrainConfig, device, check: Callable[[], None]):
    """(tokenizer, model) for the task: a first tokenizer on the tasks' own text renders teacher
    conversations (chat template, tool schemas, tool responses); the final one is trained on both.
    `check()` between batches of teacher conversations (it raises to stop)."""
    tasks = demo_tasks(cfg, CORPUS_TASKS)
    texts = [message["content"] for task in tasks for message in task.messages]
    draft = train_bpe_tokenizer(texts, cfg.model.tiny.vocab_size, individual_digits=True)
    conversations = teacher_episodes(cfg, draft, tasks, check)
    texts += [draft.decode(e.turns[-1].prompt_ids + e.turns[-1].response_ids) for e in conversations]
    return build_tiny(texts, cfg.model.tiny, cfg.seed, device, individual_digits=True)


def task_warm_start(model, tokenizer, cfg: TrainConfig, check: Callable[[], None]) -> list[float]:
    """Fine-tune `model` in place on teacher episodes (`check()` between batches of them and before every
    step: it raises to stop); returns the loss of every step."""
    warm_start = cfg.model.warm_start
    n_tasks = warm_start.iterations * cfg.group.n_tasks * cfg.group.group_size
    demos = teacher_episodes(cfg, tokenizer, demo_tasks(cfg, n_tasks), check)
    log.info("task warm start: %d steps on %d teacher turns", warm_start.steps, sum(len(e.turns) for e in demos))
    losses = supervised_finetune(model, per_turn(demos), tokenizer.pad_token_id, warm_start.steps,
                                 warm_start.batch_size, warm_start.lr, seed=cfg.seed, check=check)
    if losses:
        log.info("task warm start: loss %.3f -> %.3f", losses[0], losses[-1])
    return losses
