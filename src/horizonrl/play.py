"""`horizonrl play ENV`: a person plays an env in the terminal, shown exactly the messages the agent
gets (same system prompt, memory window and response format), answering as the model would.

A reply without `ACTION:` is taken as the action itself; it goes through the agent's own parsing, so
near-miss translation and the default action on invalid output behave as they do in training.
"""

from __future__ import annotations

from collections.abc import Callable

from horizonrl import envs as registry
from horizonrl.agents.actions import ACTION_TAG, decide
from horizonrl.agents.prompt import HistoryEntry, build_messages, plan_text, system_prompt


def render(messages: list[dict]) -> str:
    return "\n".join(f"----- {m['role']} -----\n{m['content']}" for m in messages)


def play(env_id: str, kwargs: dict, seed: int = 0, memory: int = 1, invalid_penalty: float = -0.1,
         ask: Callable[[str], str] = input, show: Callable[[str], None] = print) -> float:
    """Play one episode; returns its return. An empty reply (or end of input) stops early."""
    env = registry.make(env_id, **kwargs)
    observation, _ = env.reset(seed)
    history: list[HistoryEntry] = []
    episode_return = 0.0
    while True:
        show(render(build_messages(system_prompt(env.instruction), history, observation, memory)))
        try:
            reply = ask("\nyour reply> ").strip()
        except EOFError:
            reply = ""
        if not reply:
            show("stopped.")
            return episode_return
        decision = decide(reply if ACTION_TAG in reply else f"{ACTION_TAG} {reply}", env.actions,
                          env.default_action, env.translations)
        next_observation, reward, terminated, truncated, info = env.step(decision.action)
        reward += 0.0 if decision.valid else invalid_penalty
        episode_return += reward
        status = "" if decision.valid else f" (invalid: {decision.raw_action!r}, ran the default action)"
        show(f"\n>>> executed {decision.action!r}{status}; reward {reward:g}\n")
        history.append(HistoryEntry(observation, plan_text(decision.think, decision.action)))
        observation = next_observation
        if terminated or truncated:
            outcome = "success" if info.get("success") else ("time limit" if truncated else "failure")
            show(f"{observation}\n\nepisode over: {outcome}, return {episode_return:g}, "
                 f"progress {info.get('progress', 0.0):g}")
            return episode_return


def list_envs() -> str:
    """Every env id with one line on it; an env that cannot run here (its package is not installed) says so and
    what to install, in place of its description."""
    width = max(len(env_id) for env_id in registry.REGISTRY)
    lines = []
    for env_id, spec in sorted(registry.REGISTRY.items()):
        try:
            registry.factory(env_id)
            lines.append(f"{env_id:<{width}}  {spec.description}")
        except ValueError as error:
            lines.append(f"{env_id:<{width}}  not runnable here: {error}")
    return "\n".join(lines)
