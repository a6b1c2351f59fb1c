"""An OpenAI-compatible gateway over our engine that records the exact tokens of every call (server),
the OpenAI request/response formats (openai_api), the recorded calls per rollout (recorder), and the training
collector that runs the user's own agents against it (agent_groups)."""

from horizonrl.gateway.recorder import Call, Recorder, Rollout
from horizonrl.gateway.server import Gateway, GatewayThread

__all__ = ["Call", "Gateway", "GatewayThread", "Recorder", "Rollout"]
