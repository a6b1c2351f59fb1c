"""Per-token log-probs, entropies and values of training rows, in micro-batches.

All outputs are row layout [B, T], aligned with input_ids: entry t is about token t (its log-prob
given ids[:t], or the value of the state ids[:t] before it), and zero where loss_mask[t] == 0.
Logits are computed only at the positions that predict sampled tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from horizonrl.learner.device import autocast
from horizonrl.samples.tensors import pad


def token_logprobs(policy, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                   temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """(logp, entropy) of each sampled token under softmax(logits / temperature).

    Assumes logits = lm_head(last hidden state), true of Llama/Qwen/Mistral-family models.
    """
    with autocast(input_ids.device):
        hidden = policy.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        predicts = loss_mask[:, 1:].bool()            # hidden[:, t-1] predicts token t
        logits = policy.get_output_embeddings()(hidden[:, :-1][predicts])
    log_probs = (logits.float() / temperature).log_softmax(dim=-1)
    targets = input_ids[:, 1:][predicts]
    logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    return _scatter(logp, predicts), _scatter(entropy, predicts)


def token_values(critic, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> Tensor:
    """values[:, t] = V(ids[:t]), the value of the state before sampled token t."""
    with autocast(input_ids.device):
        state_values = critic(input_ids, attention_mask)
    predicts = loss_mask[:, 1:].bool()
    return _scatter(state_values[:, :-1][predicts], predicts)


def _scatter(values: Tensor, predicts: Tensor) -> Tensor:
    out = torch.zeros((predicts.shape[0], predicts.shape[1] + 1), dtype=values.dtype, device=values.device)
    out[:, 1:][predicts] = values
    return out


def micro_batches(data: dict[str, Tensor], rows: list[int], size: int):
    """Slices of `rows` of at most `size` rows, each trimmed to its longest row."""
    for begin in range(0, len(rows), size):
        index = torch.tensor(rows[begin:begin + size], device=data["input_ids"].device)
        width = int(data["attention_mask"][index].sum(dim=1).max())
        yield {key: value[index, :width] for key, value in data.items()}


@torch.no_grad()
def score(data: dict[str, Tensor], micro_batch_size: int, temperature: float = 1.0, actor=None,
          reference=None, critic=None) -> dict[str, Tensor]:
    """[R, T] tensors from the networks given: logp_old and entropy (actor), logp_ref (reference),
    values_old (critic)."""
    rows = list(range(data["input_ids"].shape[0]))
    width = data["input_ids"].shape[1]
    parts: dict[str, list[Tensor]] = {}

    def keep(key: str, value: Tensor) -> None:
        parts.setdefault(key, []).append(torch.nn.functional.pad(value, (0, width - value.shape[1])))

    for mb in micro_batches(data, rows, micro_batch_size):
        args = (mb["input_ids"], mb["attention_mask"], mb["loss_mask"])
        if actor is not None:
            logp, entropy = token_logprobs(actor, *args, temperature=temperature)
            keep("logp_old", logp)
            keep("entropy", entropy)
        if reference is not None:
            keep("logp_ref", token_logprobs(reference, *args, temperature=temperature)[0])
        if critic is not None:
            keep("values_old", token_values(critic, *args))
    return {key: torch.cat(value) for key, value in parts.items()}


@torch.no_grad()
def prompt_values(critic, prompts: list[list[int]], pad_id: int, micro_batch_size: int, device) -> Tensor:
    """V(prompt) for each prompt: the critic's value at its last token (the bootstrap V(s_{T+1}))."""
    out = []
    for begin in range(0, len(prompts), micro_batch_size):
        chunk = prompts[begin:begin + micro_batch_size]
        input_ids = pad(chunk, pad_id, torch.long, device)
        attention_mask = pad([[1] * len(p) for p in chunk], 0, torch.long, device)
        with autocast(input_ids.device):
            state_values = critic(input_ids, attention_mask)
        last = attention_mask.sum(dim=1) - 1
        out.append(state_values[torch.arange(len(chunk), device=device), last])
    return torch.cat(out) if out else torch.zeros(0, device=device)
