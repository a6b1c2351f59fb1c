"""Scripted engines: responses written by code instead of sampled from a model (teachers for the
supervised warm start, test doubles). They have no log-probs and no weights, and write their text as it
is: a request's `grammar` does not constrain it (a teacher or a test double writes what it means to)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from horizonrl.agents.prompt import current_observation, plan_text, restate
from horizonrl.engines.base import Generation, SamplingParams


def scripted_generation(tokenizer, text: str, params: SamplingParams) -> Generation:
    """A scripted response as an engine returns it: `text` and EOS; with `stop_patterns`, `text` and a
    newline, cut where the first match ends (no EOS), as a model's response would stop."""
    with_newline = text + "\n"
    ends = [m.end() for m in (re.search(p, with_newline) for p in params.stop_patterns) if m]
    if ends:
        return Generation(tokenizer.encode(with_newline[: min(ends)], add_special_tokens=False), None, "stop")
    return Generation(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id], None, "stop")


class ScriptedEngine:
    """An engine whose response to a prompt is `respond(prompt_text)` (a teacher or a test double)."""

    def __init__(self, tokenizer, respond: Callable[[str], str]):
        self.tokenizer, self.respond = tokenizer, respond

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return scripted_generation(self.tokenizer, self.respond(self.tokenizer.decode(prompt_ids)), params)

    def sync_weights(self, model) -> None:
        raise TypeError("ScriptedEngine samples from no model; there are no weights to sync")


class RandomFormatEngine(ScriptedEngine):
    """Follows the response format but picks its action uniformly at random.

    It stands in for an instruct model when the policy is a tiny model trained from scratch: its
    responses are the demonstrations of the supervised warm start. Like an instruct model's
    reasoning, the THINK part restates the current observation; the action ignores it, so
    reinforcement learning has to find out which action is good.

    Actions are drawn uniformly without replacement per observation (each observation cycles through
    a shuffled action list), so in the demonstrations every action is equally frequent in every state
    up to one, and the warm-started policy carries no accidental preference that a finite sample
    would give it.
    """

    def __init__(self, tokenizer, actions: list[str], seed: int = 0):
        super().__init__(tokenizer, self.plan)
        self.actions = actions
        self.rng = random.Random(seed)
        self.unused: dict[str, list[str]] = {}   # per observation: actions not yet drawn in this cycle

    def plan(self, prompt_text: str) -> str:
        observation = current_observation(prompt_text)
        unused = self.unused.get(observation)
        if not unused:
            unused = self.unused[observation] = self.rng.sample(self.actions, len(self.actions))
        return plan_text(restate(observation), unused.pop())


class ExpertEngine:
    """Plays the action of an env's expert (`env.expert_action() -> (action, reason)`, e.g. BabyAI's
    bot) in the agent's response format, the reason as its THINK. The env must live in this process:
    `handle` is an `InProcessEnv`, and the engine answers for that one env only.

    With `noise` > 0, each turn with that probability plays a uniformly random other action of
    `env.expert_recovers_from()` instead (the expert is still asked next turn, so it replans from the deviation;
    where there is no other, the expert's own). Those turns, as (prompt ids, response ids), are in `deviations`:
    they are not demonstrations. (A turn of another episode with the same prompt is told apart by its response,
    the expert's action, which a deviation never plays.)"""

    def __init__(self, tokenizer, handle, noise: float = 0.0, seed: int = 0):
        self.tokenizer, self.handle, self.noise = tokenizer, handle, noise
        self.rng = random.Random(seed)
        self.deviations: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        action, reason = self.handle.env.expert_action()
        others = []
        if self.noise and self.rng.random() < self.noise:
            others = [other for other in self.handle.env.expert_recovers_from() if other != action]
        deviates = bool(others)
        if deviates:
            action = self.rng.choice(others)
        generation = scripted_generation(self.tokenizer, plan_text(reason, action), params)
        if deviates:
            self.deviations.add((tuple(prompt_ids), tuple(generation.token_ids)))
        return generation

    def sync_weights(self, model) -> None:
        raise TypeError("ExpertEngine plays an env's expert, not a model; there are no weights to sync")
