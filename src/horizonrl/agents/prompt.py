"""Prompt building: the system instruction, a memory window of past turns, the current observation.

Layout with memory window n (Verlog; n = 1 by default):
    system     instruction: intro, actions, tips, then the mission (the part that differs last)
    user       "Observation:\n{obs_{t-n}}"          \\  repeated for each of the
    assistant  "Previous plan:\n{plan_{t-n}}"        /   last n turns
    user       "Current Observation:\n{obs_t}\n\n" + RESPONSE_FORMAT
A plan is the turn's reasoning plus the action actually executed, never invalid text.
With full history and continuation feedback, each later observation is appended inside the assistant
message as `continuation_text`.
"""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.agents.actions import ACTION_TAG, THINK_TAG
from horizonrl.envs.base import Instruction

RESPONSE_FORMAT = (
    "What will you do next? Please respond in the following format:\n"
    f"{THINK_TAG} step-by-step reasoning\n"
    f"{ACTION_TAG} One valid action from the allowed set."
)
CURRENT_OBSERVATION = "Current Observation:\n"


@dataclass(frozen=True)
class HistoryEntry:
    """One past turn: its observation and plan (for the memory window), and its exact prompt and
    response ids (for the full-history prompt, which extends them token for token)."""

    observation: str
    plan: str
    prompt_ids: tuple[int, ...] = ()
    response_ids: tuple[int, ...] = ()


def system_prompt(instruction: Instruction) -> str:
    """Verlog's BabyAI system prompt (from BALROG) with the mission moved to its last line: what is the same
    in every episode of an env comes first, so the rows of different episodes share ~all of it, in the
    learner (optim.shared_prefix) and in an engine's prefix cache."""
    actions = ", ".join(f"{name}: {description}" if description else name
                        for name, description in instruction.actions.items())
    tips = "; ".join(instruction.tips) if instruction.tips else "none"
    return (
        f"{instruction.intro}.\n"
        "The following are the possible actions you can take in the game, followed by a short "
        f"description of each action: {actions}.\n"
        f"In a moment I will present you an observation. Tips: {tips}.\n"
        f"Your goal is to {instruction.mission}.\n"
        "PLAY!"
    )


def plan_text(think: str, action: str) -> str:
    """The history's record of a turn: the reasoning and the executed action."""
    return f"{THINK_TAG} {think}\n{ACTION_TAG} {action}"


def current_observation(prompt_text: str) -> str:
    """The current observation inside a prompt rendered from `build_messages` (for scripted policies)."""
    after = prompt_text.rsplit(CURRENT_OBSERVATION, 1)[-1]
    return after.split(f"\n\n{RESPONSE_FORMAT}", 1)[0].removesuffix("\n\n")


def restate(observation: str) -> str:
    """An observation as one line of reasoning, the way an instruct model often begins its THINK."""
    return " ".join(line.strip() for line in observation.splitlines() if line.strip())


def build_messages(system: str, history: list[HistoryEntry], observation: str, memory: int) -> list[dict]:
    """Chat messages for the current turn with the last `memory` turns of history."""
    messages = [{"role": "system", "content": system}]
    for entry in history[-memory:] if memory > 0 else []:
        messages.append({"role": "user", "content": f"Observation:\n{entry.observation}"})
        messages.append({"role": "assistant", "content": f"Previous plan:\n{entry.plan}"})
    messages.append({"role": "user", "content": user_message(observation)})
    return messages


def user_message(observation: str) -> str:
    """The user message of the current turn: the observation and the response format."""
    return f"{CURRENT_OBSERVATION}{observation}\n\n{RESPONSE_FORMAT}"


def continuation_text(observation: str, after_newline: bool) -> str:
    """An observation appended inside the assistant message (continuation feedback), on a line of
    its own, followed by a blank line where the model continues with its THINK."""
    blank_line = "\n" if after_newline else "\n\n"
    return f"{blank_line}{CURRENT_OBSERVATION}{observation}\n\n"
