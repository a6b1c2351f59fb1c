"""In-process engine: a transformers causal LM sampling with a KV cache.

Requests from all env streams queue up; whenever the engine is free it takes every pending request
as one batch (left padding, explicit position ids, one KV cache) and runs it in a worker thread, so
the event loop keeps stepping envs meanwhile. We sample with our own loop rather than
`model.generate` because each request has its own max_tokens / temperature / top_p / stop ids and we
need the exact log-probs of the sampled ids under the sampling distribution.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from horizonrl.engines.base import Generation, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


class HFEngine:
    """Engine over a transformers causal LM held in this process.

    The engine can share the learner's actor module (then `sync_weights` has nothing to copy) or own
    a separate copy (then `sync_weights` loads the actor's state dict). `tokenizer` decodes responses
    for requests with `stop_patterns`.
    """

    def __init__(self, model, pad_id: int, max_batch_size: int = 256, seed: int = 0,
                 autocast_dtype: torch.dtype | None = None, tokenizer=None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self._pending: list[_Request] = []
        self._server: asyncio.Task | None = None

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if params.stop_patterns and self.tokenizer is None:
            raise ValueError("stop_patterns need the engine to decode responses: HFEngine(..., tokenizer=...)")
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(prompt_ids), params, future))
        if self._server is None or self._server.done():
            self._server = asyncio.create_task(self._serve())
        return await future

    def sync_weights(self, model) -> None:
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())

    async def _serve(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # every stream that is ready submits before the batch closes
            batch = self._pending[: self.max_batch_size]
            del self._pending[: self.max_batch_size]
            try:
                outputs = await asyncio.to_thread(self.generate_batch, [r.prompt_ids for r in batch],
                                                  [r.params for r in batch])
            except Exception as error:  # every waiting request learns about it
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            for request, output in zip(batch, outputs):
                if not request.future.done():
                    request.future.set_result(output)

    @torch.inference_mode()
    def generate_batch(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Sample a response for every prompt in one padded batch."""
        device, batch = self.device, len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long, device=device)
        attention = torch.zeros((batch, width), dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, device=device)
            attention[row, width - len(prompt):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        temperature = torch.tensor([p.temperature for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        max_tokens = torch.tensor([p.max_tokens for p in params], device=device)
        stop_width = max(1, max(len(p.stop_ids) for p in params))
        stop_ids = torch.full((batch, stop_width), -1, dtype=torch.long, device=device)
        for row, p in enumerate(params):
            stop_ids[row, : len(p.stop_ids)] = torch.tensor(p.stop_ids, dtype=torch.long, device=device)

        patterns = [[re.compile(pattern) for pattern in p.stop_patterns] for p in params]
        response_ids: list[list[int]] = [[] for _ in range(batch)]

        cache = DynamicCache()
        logits = self._forward(input_ids, attention, positions, cache, logits_to_keep=1)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        length = torch.zeros(batch, dtype=torch.long, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens, logprobs = [], []
        for step in range(int(max_tokens.max())):
            token, logprob = sample(logits, temperature, top_p, self.generator)
            tokens.append(token)
            logprobs.append(logprob)
            length = torch.where(done, length, length + 1)
            hit_stop = (token[:, None] == stop_ids).any(dim=1)
            if any(patterns):
                hit_stop |= self._matches_stop_pattern(token.tolist(), response_ids, patterns, done)
            hit_stop &= ~done
            stopped |= hit_stop
            done |= hit_stop | (length >= max_tokens)
            if bool(done.all()):
                break
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            logits = self._forward(token[:, None], attention, positions, cache)

        tokens = torch.stack(tokens, dim=1).tolist()
        logprobs = torch.stack(logprobs, dim=1).tolist()
        return [
            Generation(tokens[row][:n], logprobs[row][:n], "stop" if is_stop else "length")
            for row, (n, is_stop) in enumerate(zip(length.tolist(), stopped.tolist()))
        ]

    def _matches_stop_pattern(self, token: list[int], response_ids: list[list[int]],
                              patterns: list[list[re.Pattern]], done: torch.Tensor) -> torch.Tensor:
        """Append this step's token to each running row's response; True where the decoded response
        now contains a match of one of the row's stop patterns."""
        hits = []
        for row, (ids, row_patterns) in enumerate(zip(response_ids, patterns)):
            if row_patterns and not done[row]:
                ids.append(token[row])
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                hits.append(any(p.search(text) for p in row_patterns))
            else:
                hits.append(False)
        return torch.tensor(hits, device=done.device)

    def _forward(self, input_ids, attention, positions, cache, logits_to_keep: int = 0) -> torch.Tensor:
        autocast = (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype
                    else contextlib.nullcontext())
        with autocast:
            out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=logits_to_keep)
        return out.logits[:, -1].float()


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and its log-prob under the sampling distribution.

    Row b samples from softmax(logits_b / temperature_b) restricted to the smallest set of tokens
    whose probability reaches top_p_b (renormalised). Temperature 0 is greedy; its log-prob is taken
    under the untempered distribution.
    """
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    outside_nucleus = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_logits = sorted_logits.masked_fill(outside_nucleus, float("-inf"))
    filtered = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    log_probs = filtered.log_softmax(dim=-1)
    sampled = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)
    token = torch.where(greedy, scaled.argmax(dim=-1), sampled)
    logprob = torch.where(greedy, scaled.log_softmax(dim=-1).gather(-1, token[:, None]).squeeze(-1),
                          log_probs.gather(-1, token[:, None]).squeeze(-1))
    return token, logprob
