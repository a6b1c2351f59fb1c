from horizonrl.agents.actions import Decision, decide
from horizonrl.agents.agent import Agent, chat_prompt_ids
from horizonrl.agents.prompt import HistoryEntry, build_messages, system_prompt

__all__ = ["Agent", "Decision", "HistoryEntry", "build_messages", "chat_prompt_ids", "decide", "system_prompt"]
