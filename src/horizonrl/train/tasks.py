"""Agent-loop tasks in a training job: the objects a `task:` config section names, and the tiny
model's tokenizer and warm start for a task.

The tiny model learns the task's format from its teacher (a "module:function" that takes the tasks
and returns a responder, prompt text -> response text): the tokenizer is trained on the text of
teacher conversations rendered through the chat template, and the warm start fine-tunes on teacher
episodes collected through the real agent loop, so its prompts are exactly those RL will use. A
`task.agent` (an OpenAI-API agent of the user's) plays the teacher's episodes itself, through a gateway
over the teacher, so the warm start sees exactly the prompts the agent's calls render.
"""

from __future__ import annotations

import asyncio
import logging

from horizonrl.config import TrainConfig
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway.recorder import Recorder
from horizonrl.gateway.server import Gateway
from horizonrl.learner.sft import supervised_finetune
from horizonrl.learner.tokenizer import train_bpe_tokenizer
from horizonrl.records import Episode, Task
from horizonrl.gateway.agent_groups import AgentGroupCollector, RunSampling
from horizonrl.rollout.agent_loop import AgentLoop
from horizonrl.rollout.episode_groups import load_reward_fn
from horizonrl.rollout.interaction import as_interaction
from horizonrl.rollout.task_groups import TaskGroupCollector
from horizonrl.samples.per_turn import per_turn
from horizonrl.tools.registry import import_target, tools_from_references
from horizonrl.train.warm_start import build_tiny

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
                   share: range | None = None) -> TaskGroupCollector | AgentGroupCollector:
    """The agent loop's collector, or with `task.agent` the user's agent's, through a gateway over `engine`."""
    if cfg.task.agent is not None:
        return agent_collector(cfg, tokenizer, engine, params, context_len, cfg.group.group_size, share)
    return TaskGroupCollector(make_agent_loop(cfg, tokenizer, engine, params), import_target(cfg.task.source),
                              cfg.group.n_tasks, cfg.group.group_size, load_reward_fn(cfg.group.reward_fn), cfg.seed,
                              share)


def agent_collector(cfg: TrainConfig, tokenizer, engine: Engine, params: SamplingParams, context_len: int,
                    group_size: int, share: range | None = None) -> AgentGroupCollector:
    """`task.agent` played through a gateway (on a free local port) that samples at the run's temperature and
    top_p (whatever the agent asks: the learner scores at them) and gives at most `params.max_tokens` per call."""
    sampler = RunSampling(engine, params.temperature, params.top_p)
    gateway = Gateway(sampler, tokenizer, cfg.model.path or cfg.name, context_len, params.stop_ids,
                      Recorder(issued_only=True), max_tokens_limit=params.max_tokens, max_n=1)
    reward_fn = None if cfg.group.reward_fn is None else load_reward_fn(cfg.group.reward_fn)
    return AgentGroupCollector(import_target(cfg.task.agent), import_target(cfg.task.source), gateway,
                               cfg.group.n_tasks, group_size, reward_fn, cfg.task.agent_timeout_s, cfg.seed, share)


def demo_tasks(cfg: TrainConfig, n_tasks: int) -> list[Task]:
    """The first `n_tasks` tasks of the teacher's seed range."""
    make_task = import_target(cfg.task.source)
    return [make_task(DEMO_SEED + seed) for seed in range(n_tasks)]


def teacher_episodes(cfg: TrainConfig, tokenizer, tasks: list[Task]) -> list[Episode]:
    """The teacher's episodes on `tasks`, through the real agent loop (or the run's own agent and gateway; the
    episodes its agent fails are left out)."""
    engine = ScriptedEngine(tokenizer, import_target(cfg.task.teacher)(tasks))
    params = SamplingParams(max_tokens=cfg.rollout.max_tokens, stop_ids=(tokenizer.eos_token_id,))
    if cfg.task.agent is None:
        return asyncio.run(_run_all(make_agent_loop(cfg, tokenizer, engine, params), tasks))
    collector = agent_collector(cfg, tokenizer, engine, params, TEACHER_CONTEXT, group_size=1)
    try:
        return [episode for episode in collector.run(tasks) if "error" not in episode.metrics]
    finally:
        collector.close()


async def _run_all(loop: AgentLoop, tasks) -> list[Episode]:
    return list(await asyncio.gather(*(loop.run(task, task.task_id) for task in tasks)))


def build_tiny_for_task(cfg: TrainConfig, device):
    """(tokenizer, model) for the task: a first tokenizer on the tasks' own text renders teacher
    conversations (chat template, tool schemas, tool responses); the final one is trained on both."""
    tasks = demo_tasks(cfg, CORPUS_TASKS)
    texts = [message["content"] for task in tasks for message in task.messages]
    draft = train_bpe_tokenizer(texts, cfg.model.tiny.vocab_size, individual_digits=True)
    conversations = teacher_episodes(cfg, draft, tasks)
    texts += [draft.decode(e.turns[-1].prompt_ids + e.turns[-1].response_ids) for e in conversations]
    return build_tiny(texts, cfg.model.tiny, cfg.seed, device, individual_digits=True)


def task_warm_start(model, tokenizer, cfg: TrainConfig) -> list[float]:
    """Fine-tune `model` in place on teacher episodes; returns the loss of every step."""
    warm_start = cfg.model.warm_start
    n_tasks = warm_start.iterations * cfg.group.n_tasks * cfg.group.group_size
    demos = teacher_episodes(cfg, tokenizer, demo_tasks(cfg, n_tasks))
    losses = supervised_finetune(model, per_turn(demos), tokenizer.pad_token_id, warm_start.steps,
                                 warm_start.batch_size, warm_start.lr, seed=cfg.seed)
    if losses:
        log.info("task warm start: %d teacher turns, loss %.3f -> %.3f",
                 sum(len(e.turns) for e in demos), losses[0], losses[-1])
    return losses
