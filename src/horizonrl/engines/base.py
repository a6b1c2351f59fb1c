"""The Engine protocol: token ids in, sampled token ids and their log-probs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """max_tokens new tokens at most; temperature 0 means greedy; stop_ids end a response (and are
    kept in it when sampled); so does the first token after which the decoded response text contains a
    match of one of `stop_patterns` (regular expressions; every sampled id is kept, none is cut).
    `seed` names the request's own random stream (a sampling engine combines it with its own seed;
    None: the engine derives one), so that what a request samples does not depend on its batch mates."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    stop_patterns: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """`token_ids` exactly as sampled; `logprobs[i]` = log-prob of token_ids[i] under the sampling
    distribution (after temperature and top-p); None for engines that do not sample from a model."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: Literal["stop", "length"]


@runtime_checkable
class Engine(Protocol):
    """What a collector samples from: HFEngine (a model), or a scripted teacher or test double."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights."""
        ...


@runtime_checkable
class TrainingEngine(Engine, Protocol):
    """An engine a training run samples from: its state (e.g. the weights version that seeds its
    requests) is checkpointed with the run and restored on resume."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
