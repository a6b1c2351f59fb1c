"""An engine that follows the response format but picks its action uniformly at random.

It stands in for an instruct model when the policy is a tiny model trained from scratch: its
responses are the demonstrations of the supervised warm start. Like an instruct model's reasoning,
the THINK part restates the current observation; the action ignores it, so reinforcement learning
has to find out which action is good.

Actions are drawn uniformly without replacement per observation (each observation cycles through a
shuffled action list), so in the demonstrations every action is equally frequent in every state up to
one, and the warm-started policy carries no accidental preference that a finite sample would give it.

A response is the plan and EOS; with `stop_patterns`, the plan and a newline, cut where the first match
ends (no EOS).
"""

from __future__ import annotations

import random
import re

from horizonrl.agents.prompt import current_observation, plan_text, restate
from horizonrl.engines.base import Generation, SamplingParams


class RandomFormatEngine:
    def __init__(self, tokenizer, actions: list[str], seed: int = 0):
        self.tokenizer, self.actions = tokenizer, actions
        self.rng = random.Random(seed)
        self.unused: dict[str, list[str]] = {}   # per observation: actions not yet drawn in this cycle

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        observation = current_observation(self.tokenizer.decode(prompt_ids))
        unused = self.unused.get(observation)
        if not unused:
            unused = self.unused[observation] = self.rng.sample(self.actions, len(self.actions))
        plan = plan_text(restate(observation), unused.pop())
        text = plan + "\n"
        ends = [m.end() for m in (re.search(p, text) for p in params.stop_patterns) if m]
        if ends:
            return Generation(self.tokenizer.encode(text[: min(ends)], add_special_tokens=False), None, "stop")
        ids = self.tokenizer.encode(plan, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, None, "stop")

    def sync_weights(self, model) -> None:
        raise TypeError("RandomFormatEngine samples from no model; there are no weights to sync")
