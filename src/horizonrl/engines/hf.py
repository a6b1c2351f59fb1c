"""In-process engine: a transformers causal LM sampling with a KV cache, continuously batched.

One worker thread owns the running batch (left padding, explicit position ids, one KV cache) and
loops over decode steps while the event loop keeps stepping envs. Every step admits the requests
that arrived meanwhile: their prompts run in the same forward pass as the running rows' next tokens;
after every step the responses that ended leave the batch and their futures resolve at once. So a
long response or a slow env holds back only its own stream. The KV of every ended sequence is kept
(up to a token budget, until the weights change): a later prompt that extends it, as a multi-turn
stream's next prompt extends its last prompt and response, prefills only the new tokens. We sample with our own loop rather than
`model.generate` because each request has its own max_tokens / temperature / top_p / stop ids and we
need the exact log-probs of the sampled ids under the sampling distribution.

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
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from horizonrl.engines.base import Generation, RequestSeeds, SamplingParams, matches_stop_pattern, settle


@dataclass(eq=False)
class _Request:
    """A prompt, its sampling controls and the response sampled so far; `future` (None for
    `generate_batch`, whose caller collects the results) receives the Generation when it ends."""

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator  # this request's own draws
    weights_version: int
    future: asyncio.Future | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


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
    next forward pass, and for rows whose prompt has not run yet)."""

    requests: list[_Request]
    cache: DynamicCache
    attention: torch.Tensor  # [B, T]
    logits: torch.Tensor | None  # [B, vocab], float32


class HFEngine:
    """Engine over a transformers causal LM held in this process.

    The engine can share the learner's actor module (then `sync_weights` has nothing to copy) or own
    a separate copy (then `sync_weights` loads the actor's state dict); call it between rollouts, never
    during one. `tokenizer` decodes responses for requests with `stop_patterns`. At most
    `max_batch_size` requests decode at once; the others wait for a row to free up. The KV of ended
    sequences is kept for prompts that extend them, at most `prefix_cache_tokens` tokens in all (the
    oldest go first; 0 turns this off). Newcomers' prompts run in the same forward pass as the running
    rows' next tokens unless that would pad the running rows with more than `max_padding_tokens`
    tokens in all; then they run in a pass of their own. Each request samples from its own generator,
    seeded by `RequestSeeds` (the weights version is how many `sync_weights` came before). So what a
    request samples does not depend on which other requests share its decode steps (up to float
    rounding of batched matmuls), and a run whose collectors set `params.seed` is reproducible however
    the arrivals interleave.
    """

    def __init__(self, model, pad_id: int, max_batch_size: int = 256, seed: int = 0,
                 autocast_dtype: torch.dtype | None = None, tokenizer=None, prefix_cache_tokens: int = 65536,
                 max_padding_tokens: int = 32):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.seeds = RequestSeeds(seed)
        self.prefix_cache_tokens = prefix_cache_tokens
        self.max_padding_tokens = max_padding_tokens
        self._prefixes: list[_Prefix] = []  # oldest first; used by whichever thread decodes
        self._lock = threading.Lock()  # guards _pending and _working, shared with the worker thread
        self._pending: list[_Request] = []
        self._working = False  # a worker thread is running, or starting
        self._server: asyncio.Task | None = None  # holds the task that awaits the worker thread

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if params.stop_patterns and self.tokenizer is None:
            raise ValueError("stop_patterns need the engine to decode responses: HFEngine(..., tokenizer=...)")
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending.append(self._request(prompt_ids, params, future))
            start, self._working = not self._working, True
        if start:
            self._server = asyncio.create_task(self._serve())
        return await future

    def sync_weights(self, model, tensors: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Sample from `model`'s weights (`tensors`, see Engine.sync_weights) from now on, copied into
        this engine's own module unless it is `model`; the kept KV, computed with the old ones, goes."""
        if model is not self.model:
            own = self.model.state_dict()
            for name, tensor in (model.state_dict().items() if tensors is None else tensors):
                own[name].copy_(tensor)
        self._prefixes = []
        with self._lock:
            self.seeds.new_version()

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the weights version. Saved right after `sync_weights`, when no KV is
        kept and no request counted yet, this is all that decides what the engine samples next. (Saved
        before any sync, as after the critic warmup, the kept KV is dropped: prompts that would have
        extended it are prefilled whole, which moves float rounding only, as batching does.)"""
        return {"weights_version": self.seeds.version}

    def load_state_dict(self, state: dict) -> None:
        self.seeds.new_version(state["weights_version"])

    def sleep(self) -> None:
        """Nothing to free: the engine samples from the learner's own module (or a copy it keeps)."""

    def close(self) -> None:
        """Nothing to stop: the engine is this process's module and threads that end with their work."""

    def _request(self, prompt_ids: list[int], params: SamplingParams, future=None) -> _Request:
        """A request with its own generator (seeded as the class docstring says); call under the lock."""
        generator = torch.Generator(self.device).manual_seed(self.seeds.next(prompt_ids, params.seed))
        return _Request(list(prompt_ids), params, generator, self.seeds.version, future)

    async def _serve(self) -> None:
        await asyncio.sleep(0)  # every stream that is ready submits before the first prefill
        await asyncio.to_thread(self._run)

    def _run(self) -> None:
        """Worker thread: decode until nothing is running or pending, admitting the pending requests
        at every step and resolving each future as soon as its response ends."""
        batch = None
        while (newcomers := self._admit(batch)) is not None:
            try:
                batch, finished = self._step(batch, newcomers)
            except Exception as error:  # every request the engine holds learns about it
                for request in {*newcomers, *(batch.requests if batch else ())}:
                    settle(request.future, error)
                batch = None
                continue
            for request, generation in finished:
                settle(request.future, generation)

    def _admit(self, batch: _Batch | None) -> list[_Request] | None:
        """Take the pending requests that fit next to `batch`; None when there is nothing to run,
        decided under the lock so that the next `generate` starts a new worker."""
        with self._lock:
            room = self.max_batch_size - (len(batch.requests) if batch else 0)
            newcomers = self._pending[:room]
            del self._pending[:room]
            if batch is None and not newcomers:
                self._working = False
                return None
            return newcomers

    def generate_batch(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Sample a response for every prompt in one padded batch, run to completion."""
        with self._lock:
            requests = [self._request(prompt, p) for prompt, p in zip(prompts, params)]
        batch, results = self._step(None, requests)[0], {}
        while batch is not None:
            batch, finished = self._step(batch, [])
            results.update(finished)
        return [results[request] for request in requests]

    @torch.inference_mode()
    def _step(self, batch: _Batch | None, newcomers: list[_Request]
              ) -> tuple[_Batch | None, list[tuple[_Request, Generation]]]:
        """Sample one token for every row of `batch`; the requests that ended leave with their
        Generation. Then one forward pass runs the other rows' new tokens and the newcomers' prompts.
        Returns the batch after it (None when no row is left) and the ended requests."""
        running, finished, tokens = [], [], []
        if batch is not None:
            device = batch.logits.device
            token, logprob = sample(batch.logits,
                                    torch.tensor([r.params.temperature for r in batch.requests], device=device),
                                    torch.tensor([r.params.top_p for r in batch.requests], device=device),
                                    [r.generator for r in batch.requests])
            for row, (request, t, lp) in enumerate(zip(batch.requests, token.tolist(), logprob.tolist())):
                request.token_ids.append(t)
                request.logprobs.append(lp)
                reason = self._finish_reason(request)
                if reason is None:
                    running.append(row)
                    tokens.append([t])
                    continue
                finished.append((request, Generation(request.token_ids, request.logprobs, reason,
                                                     request.weights_version)))
                if self.prefix_cache_tokens:
                    self._keep_prefix(batch, row)
        if not running and not newcomers:
            return None, finished
        batch = _select(batch, running) if running else None
        prefixes = [self._take_prefix(r.prompt_ids) for r in newcomers]
        prompts = [r.prompt_ids[len(p.token_ids) if p else 0:] for r, p in zip(newcomers, prefixes)]
        if running and newcomers and len(running) * (max(map(len, prompts)) - 1) > self.max_padding_tokens:
            # the running rows would pad to the newcomers' prompts: run them in a pass of their own
            fresh = self._forward(_prefix_batch(newcomers, prefixes, self.device), prompts)
            return _join(self._forward(batch, tokens), fresh), finished
        if newcomers:
            fresh = _prefix_batch(newcomers, prefixes, self.device)
            batch = _join(batch, fresh) if batch else fresh
        return self._forward(batch, tokens + prompts), finished

    def _forward(self, batch: _Batch, new_tokens: list[list[int]]) -> _Batch:
        """`batch` with row b extended by new_tokens[b] (right-aligned, padding before them) and run
        through the model: the cache gains their KV and `logits` predicts each row's next token."""
        width = max(map(len, new_tokens))
        input_ids = torch.tensor([[self.pad_id] * (width - len(t)) + t for t in new_tokens], device=self.device)
        new_attention = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in new_tokens], device=self.device)
        attention = torch.cat([batch.attention, new_attention], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, -width:]
        autocast = (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype
                    else contextlib.nullcontext())
        with autocast:
            out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                             past_key_values=batch.cache, use_cache=True, logits_to_keep=1)
        return _compact(_Batch(batch.requests, batch.cache, attention, out.logits[:, -1].float()))

    def _take_prefix(self, prompt_ids: list[int]) -> _Prefix | None:
        """Remove and return the longest kept prefix that `prompt_ids` extends by at least one token."""
        fits = [p for p in self._prefixes
                if len(p.token_ids) < len(prompt_ids) and prompt_ids[:len(p.token_ids)] == p.token_ids]
        if not fits:
            return None
        prefix = max(fits, key=lambda p: len(p.token_ids))
        self._prefixes.remove(prefix)
        return prefix

    def _keep_prefix(self, batch: _Batch, row: int) -> None:
        """Keep the KV of row `row`'s prompt and response but its last token (just sampled, so not yet
        run through the model), dropping the oldest kept prefixes beyond `prefix_cache_tokens`."""
        request = batch.requests[row]
        token_ids = request.prompt_ids + request.token_ids[:-1]
        if len(token_ids) > self.prefix_cache_tokens:
            return
        columns = batch.attention[row].nonzero().squeeze(-1)
        assert len(columns) == len(token_ids)
        layers = [(layer.keys[row:row + 1, :, columns], layer.values[row:row + 1, :, columns])
                  for layer in batch.cache.layers]
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


def _prefix_batch(requests: list[_Request], prefixes: list[_Prefix | None], device: torch.device) -> _Batch:
    """The requests as rows holding the KV of their kept prefix (none: no columns), left-padded to the
    longest; no logits until their prompts run."""
    width = max((len(p.token_ids) for p in prefixes if p), default=0)
    attention = torch.tensor([[0] * (width - n) + [1] * n for n in (len(p.token_ids) if p else 0 for p in prefixes)],
                             device=device, dtype=torch.long).reshape(len(requests), width)
    cache = DynamicCache()
    if width:
        some = next(p for p in prefixes if p)
        for layer, (keys, values) in enumerate(some.layers):
            def stacked(kind, empty):
                return torch.cat([_left_pad(p.layers[layer][kind] if p else empty, width, dim=2) for p in prefixes])
            cache.update(stacked(0, keys[:, :, :0]), stacked(1, values[:, :, :0]), layer)
    return _Batch(requests, cache, attention, None)


def _join(a: _Batch, b: _Batch) -> _Batch:
    """One batch with the rows of `a` then `b` (in a's cache, which has layers; b's may have none:
    no columns); the narrower is left-padded."""
    for layer, la in enumerate(a.cache.layers):
        if b.cache.layers:
            keys, values = b.cache.layers[layer].keys, b.cache.layers[layer].values
        else:
            keys = values = la.keys.new_zeros((len(b.requests), la.keys.shape[1], 0, la.keys.shape[3]))
        la.keys, la.values = _stack(la.keys, keys, dim=2), _stack(la.values, values, dim=2)
    logits = None if a.logits is None or b.logits is None else torch.cat([a.logits, b.logits])
    return _Batch(a.requests + b.requests, a.cache, _stack(a.attention, b.attention, dim=1), logits)


def _stack(x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """x's rows then y's, right-aligned along `dim` with zeros on the left of the shorter."""
    width = max(x.shape[dim], y.shape[dim])
    return torch.cat([_left_pad(x, width, dim), _left_pad(y, width, dim)])


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    if x.shape[dim] == width:
        return x
    shape = list(x.shape)
    shape[dim] = width - x.shape[dim]
    return torch.cat([x.new_zeros(shape), x], dim=dim)


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
    token = torch.where(greedy, scaled.argmax(dim=-1), (sampling.exp() / exponential).argmax(dim=-1))
    logprob = torch.where(greedy[:, None], log_probs, sampling).gather(-1, token[:, None]).squeeze(-1)
    return token, logprob


def _nucleus(log_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Row b of `log_probs` restricted to its smallest set of top tokens whose probability reaches
    top_p_b, renormalised (rows with top_p_b >= 1 keep every token)."""
    sorted_log_probs, order = log_probs.sort(dim=-1, descending=True)
    sorted_probs = sorted_log_probs.exp()
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    outside_nucleus = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_log_probs = sorted_log_probs.masked_fill(outside_nucleus, float("-inf"))
    return torch.full_like(log_probs, float("-inf")).scatter(-1, order, sorted_log_probs).log_softmax(dim=-1)
