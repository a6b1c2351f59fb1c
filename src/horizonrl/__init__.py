"""horizonrl: multi-turn reinforcement learning for LLM agents on long-horizon tasks."""

__version__ = "0.1.0"
