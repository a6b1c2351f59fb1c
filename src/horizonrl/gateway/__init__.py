"""An OpenAI-compatible gateway over our engine that records the exact tokens of every call (server),
the OpenAI request/response formats (openai_api, responses_api), the recorded calls per rollout (recorder), and
the group rollouts of the user's own agents against it in training (agent_groups: a player of rollout/groups.py)."""

from horizonrl.gateway.recorder import Call, Recorder, Rollout
from horizonrl.gateway.server import Gateway, GatewayThread

__all__ = ["Call", "Gateway", "GatewayThread", "Recorder", "Rollout"]
