"""The Engine protocol: token ids in, sampled token ids and their log-probs out."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, Protocol, runtime_checkable

from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """max_tokens new tokens at most; temperature 0 means greedy; stop_ids end a response (and are
    kept in it when sampled); so does the first token after which the decoded response text contains a
    match of one of `stop_patterns` (regular expressions; every sampled id is kept, none is cut).
    `seed` names the request's own random stream (a sampling engine combines it with its own seed;
    None: the engine derives one), so that what a request samples does not depend on its batch mates.
    `grammar` (xgrammar EBNF, see engines/grammar.py; None: unconstrained): the text the response must
    spell before a stop id ends it. A sampling engine samples only tokens that keep the response a prefix
    of that language, and a stop id only where it is complete; its log-probs are then those of that
    masked, renormalised distribution (scripted engines write their text as it is)."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    stop_patterns: tuple[str, ...] = ()
    seed: int | None = None
    grammar: str | None = None


@dataclass(frozen=True)
class Generation:
    """`token_ids` exactly as sampled; `logprobs[i]` = log-prob of token_ids[i] under the sampling
    distribution (after the grammar's mask, temperature and top-p); None for engines that do not sample
    from a model.
    `weights_version`: how many weight syncs the engine had taken when it sampled this (None: no weights)."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: Literal["stop", "length"]
    weights_version: int | None = None


@dataclass(frozen=True)
class ScoredRow:
    """Token ids to score: `response_ids` after `prompt_ids` (both non-empty)."""

    prompt_ids: list[int]
    response_ids: list[int]


@runtime_checkable
class Engine(Protocol):
    """What a collector samples from: HFEngine (a model), or a scripted teacher or test double."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...

    def sync_weights(self, model, tensors: Iterable[tuple[str, Tensor]] | None = None) -> None:
        """Make the engine sample from `model`'s current weights: `tensors`, (name, whole tensor) pairs
        under the names of a plain model's `state_dict()`, produced one at a time (gathered from FSDP
        shards, adapters merged); None: `model.state_dict()`."""
        ...


@runtime_checkable
class TrainingEngine(Engine, Protocol):
    """An engine a training run samples from: its state (the weights version that seeds its requests)
    is checkpointed with the run and restored on resume."""

    @property
    def weights_version(self) -> int:
        """How many weight syncs the engine has taken (the version its next generations are tagged with)."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def score(self, rows: list[ScoredRow]) -> list[list[float]]:
        """For each row, the log-prob of each of its response tokens given the prompt and the response tokens
        before it, under the weights the engine samples from now, at temperature 1 (the model's own softmax):
        what the served-policy check (assembly/sync_check.py) compares with the learner's. Never while a weight
        sync runs."""
        ...

    def sleep(self) -> None:
        """Free what sampling holds (a colocated engine's weights and KV cache) for the update; the
        next `sync_weights` brings it back."""
        ...

    def close(self) -> None:
        """Release what the engine started (processes, files); it is not used again."""
        ...


class RequestSeeds:
    """The seed of each request's random stream, from the engine's `seed`, the weights version (how
    many `new_version` calls came before) and the request's `params.seed`; without one, from its
    prompt and how many requests with the same prompt came before it in this version. So what a
    request samples depends on neither its batch mates nor the order of arrival. Seeds are 63-bit.
    Two requests of one version with the same prompt and `params.seed` get the same stream, so they sample
    the same response (`SeedRepeats` tells them)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.version = 0
        self._seen: collections.Counter[bytes] = collections.Counter()  # requests per prompt in this version

    def next(self, prompt_ids: list[int], params_seed: int | None) -> int:
        if params_seed is not None:
            material = array("q", [self.seed, self.version, params_seed]).tobytes()
        else:
            prompt = _prompt_digest(prompt_ids)
            material = array("q", [self.seed, self.version, self._seen[prompt]]).tobytes() + prompt
            self._seen[prompt] += 1
        return int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "little") >> 1

    def new_version(self, version: int | None = None) -> None:
        """The weights changed (to `version`; None: the next one): requests are counted afresh."""
        self.version = self.version + 1 if version is None else version
        self._seen.clear()


class SeedRepeats:
    """Which requests repeat the prompt and `params.seed` of an earlier request sampled at the same weights
    version: `RequestSeeds` gives them the same random stream, so each samples the earlier one's response
    again. An engine retry does so on purpose; agents that send one fixed seed make a group's rollouts
    identical. Only the newest version's requests are kept, as digests: a request sampled at an older version
    (in flight across a weight update) is not checked, nor one of an engine without weights (version None)."""

    def __init__(self):
        self.version: int | None = None
        self._seen: set[tuple[int, bytes]] = set()

    def repeats(self, prompt_ids: list[int], params_seed: int | None, version: int | None) -> bool:
        """Whether this request, sampled at weights `version`, repeats an earlier one (and note it)."""
        if params_seed is None or version is None or (self.version is not None and version < self.version):
            return False
        if version != self.version:
            self.version, self._seen = version, set()
        key = (params_seed, _prompt_digest(prompt_ids))
        repeated = key in self._seen
        self._seen.add(key)
        return repeated


def _prompt_digest(prompt_ids: list[int]) -> bytes:
    return hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=16).digest()


def finish_reason(reason: str | None, request: str) -> str:
    """Our Generation's finish reason for vLLM's (or an OpenAI-compatible server's): "stop" (a stop id) or
    "length" (max_tokens or max_model_len reached). Any other ("abort", "error") ended a response that is
    not whole: a RuntimeError naming `request`, which `generate_with_retry` retries."""
    if reason not in ("stop", "length"):
        raise RuntimeError(f"{request}: a response ended by {reason!r}, not by a stop or its length: it is not whole")
    return reason


def check_grammar(params: SamplingParams) -> None:
    """ValueError for a grammar without stop ids: a stop id is what ends a complete constrained response."""
    if params.grammar is not None and not params.stop_ids:
        raise ValueError("a grammar needs stop_ids: a constrained response ends with one once it is complete")


def matches_stop_pattern(tokenizer, token_ids: list[int], patterns: tuple[str, ...]) -> bool:
    """True when the decoded `token_ids` contain a match of one of the regular expressions `patterns`."""
    if not patterns:
        return False
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    return any(re.search(pattern, text) for pattern in patterns)


def cut_at_stop_pattern(generation: Generation, tokenizer, patterns: tuple[str, ...]) -> Generation:
    """`generation` ended at its first token after which the decoded text matches a stop pattern (as
    HFEngine ends it while sampling), for engines that can only check after the response is complete.
    The tokens kept are exactly the first ones sampled, with their log-probs."""
    if not matches_stop_pattern(tokenizer, generation.token_ids, patterns):
        return generation
    end = next(k for k in range(1, len(generation.token_ids) + 1)
               if matches_stop_pattern(tokenizer, generation.token_ids[:k], patterns))
    logprobs = None if generation.logprobs is None else generation.logprobs[:end]
    return replace(generation, token_ids=generation.token_ids[:end], logprobs=logprobs, finish_reason="stop")


def settle(future: asyncio.Future, outcome: Generation | Exception) -> None:
    """From an engine's worker thread: resolve `future` with `outcome` on its event loop, unless its
    waiter has given up meanwhile."""
    def resolve():
        if not future.done():
            (future.set_exception if isinstance(outcome, Exception) else future.set_result)(outcome)
    future.get_loop().call_soon_threadsafe(resolve)
