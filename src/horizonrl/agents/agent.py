"""The agent: prompts in token ids, responses out as env actions."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from horizonrl.agents.actions import ACTION_TAG, Decision, decide
from horizonrl.agents.prompt import (HistoryEntry, build_messages, continuation_text, plan_text, system_prompt,
                                     user_message)
from horizonrl.envs.base import TextEnv


@dataclass
class Agent:
    """Builds exact prompt ids for an env and parses responses into actions.

    `memory` is the number of past turns in the prompt; `invalid_penalty` is added to the reward of a
    turn whose response named no valid action (the env's default action is executed instead);
    `translations` add to (and override) the env's own table of near-misses. `history` and
    `feedback` choose the prompt layout (see `prompt_ids`).
    """

    tokenizer: object
    memory: int = 1
    invalid_penalty: float = -0.1
    translations: dict[str, str] = field(default_factory=dict)
    history: str = "window"
    feedback: str = "new_round"

    def __post_init__(self):
        check_feedback(self.history, self.feedback)

    @property
    def stop_patterns(self) -> tuple[str, ...]:
        """With continuation feedback a response ends at the newline after its action (not at EOS,
        which would close the assistant message the observation is appended to)."""
        return (re.escape(ACTION_TAG) + r"[^\n]*\n",) if self.feedback == "continuation" else ()

    def prompt_ids(self, env: TextEnv, history: list[HistoryEntry], observation: str) -> list[int]:
        """`history="window"`: the last `memory` turns rebuilt as messages (Verlog). `history="full"`:
        the previous prompt + response ids exactly, then the observation's ids, so every prompt extends
        the one before and the turns of an episode merge into one row. The observation comes as a new
        user message (`feedback="new_round"`) or as text appended inside the assistant message, which
        the model continues (`feedback="continuation"`; a response that sampled EOS anyway closed the
        message, and its observation starts a new round)."""
        if self.history == "full" and history:
            last = history[-1]
            previous = list(last.prompt_ids) + list(last.response_ids)
            closed = bool(last.response_ids) and last.response_ids[-1] == self.tokenizer.eos_token_id
            if self.feedback == "continuation" and not closed:
                text = self.tokenizer.decode(last.response_ids, skip_special_tokens=True)
                return previous + self.tokenizer.encode(continuation_text(observation, text.endswith("\n")),
                                                        add_special_tokens=False)
            return previous + new_round_ids(self.tokenizer, [{"role": "user", "content": user_message(observation)}],
                                            closed)
        messages = build_messages(system_prompt(env.instruction), history, observation, self.memory)
        return chat_prompt_ids(self.tokenizer, messages)

    def decide(self, env: TextEnv, response_ids: list[int]) -> tuple[Decision, str]:
        """The decision for a response and the history plan it leaves (reasoning + executed action)."""
        text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        decision = decide(text, env.actions, env.default_action, {**env.translations, **self.translations})
        return decision, plan_text(decision.think, decision.action)


def check_feedback(history: str, feedback: str) -> None:
    """Continuation feedback extends the assistant message token for token: only with full history."""
    if feedback == "continuation" and history != "full":
        raise ValueError("feedback=continuation needs history=full")


def new_round_ids(tokenizer, messages: list[dict], closed: bool = True) -> list[int]:
    """The ids the chat template puts between an assistant response (ending in EOS when `closed`)
    and the next assistant header, through new `messages` (user or tool messages).

    Derived from the template itself: render a probe conversation with and without the messages
    and take the difference, plus whatever the template writes after the assistant's EOS (ChatML: a
    newline). A response cut by max_tokens gets the EOS it did not sample (as an observation token).
    """
    probe = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}]
    closed_text = tokenizer.apply_chat_template(probe, tokenize=False)
    with_messages = tokenizer.apply_chat_template(probe + messages, tokenize=False, add_generation_prompt=True)
    marker = "A" + tokenizer.eos_token
    if marker not in closed_text or not with_messages.startswith(closed_text):
        raise ValueError("the chat template does not end an assistant message with the EOS token and extend "
                         "the conversation by appending; use agent.history=window with this tokenizer")
    delta = closed_text.split(marker, 1)[1] + with_messages[len(closed_text):]
    eos = [] if closed else [tokenizer.eos_token_id]
    return eos + tokenizer.encode(delta, add_special_tokens=False)


def chat_prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """Token ids of `messages` (and the `tools` schemas) through the tokenizer's chat template, ending
    with the assistant header."""
    encoded = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)
    return list(encoded["input_ids"])
