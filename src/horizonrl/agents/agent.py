"""The agent: prompts in token ids, responses out as env actions."""

from __future__ import annotations

from dataclasses import dataclass, field

from horizonrl.agents.actions import Decision, decide
from horizonrl.agents.prompt import HistoryEntry, build_messages, plan_text, system_prompt
from horizonrl.envs.base import TextEnv


@dataclass
class Agent:
    """Builds exact prompt ids for an env and parses responses into actions.

    `memory` is the number of past turns in the prompt; `invalid_penalty` is added to the reward of a
    turn whose response named no valid action (the env's default action is executed instead);
    `translations` add to (and override) the env's own table of near-misses.
    """

    tokenizer: object
    memory: int = 1
    invalid_penalty: float = -0.1
    translations: dict[str, str] = field(default_factory=dict)

    def prompt_ids(self, env: TextEnv, history: list[HistoryEntry], observation: str) -> list[int]:
        messages = build_messages(system_prompt(env.instruction), history, observation, self.memory)
        return chat_prompt_ids(self.tokenizer, messages)

    def decide(self, env: TextEnv, response_ids: list[int]) -> tuple[Decision, str]:
        """The decision for a response and the history plan it leaves (reasoning + executed action)."""
        text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        decision = decide(text, env.actions, env.default_action, {**env.translations, **self.translations})
        return decision, plan_text(decision.think, decision.action)


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template, ending with the assistant header."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])
