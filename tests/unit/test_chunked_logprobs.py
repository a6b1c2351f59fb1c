"""Chunked log-probs and entropies equal the full-logits computation (benchmarks/memory.py's
`full_logp_entropy`, the code they replace), values and gradients, for any chunk size."""

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from horizonrl.learner.chunked_logits import chunked_logp_entropy
from horizonrl.learner.models import ValueModel
from horizonrl.learner.scoring import sampled_positions, token_logprobs, token_values

_spec = importlib.util.spec_from_file_location(
    "memory_benchmark", Path(__file__).resolve().parents[2] / "benchmarks" / "memory.py")
memory_benchmark = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(memory_benchmark)
full_logp_entropy = memory_benchmark.full_logp_entropy

N, H, V = 37, 16, 50


def tiny_llama(seed: int = 0):
    config = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def leaves(with_bias: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=generator)
    weight = torch.randn(V, H, generator=generator)
    bias = torch.randn(V, generator=generator) if with_bias else None
    targets = torch.randint(V, (N,), generator=generator)
    weights = torch.randn(2, N, generator=generator)         # d loss / d logp, d loss / d entropy
    return hidden, weight, bias, targets, weights


def values_and_grads(fn, hidden, weight, bias, targets, weights, temperature, outputs):
    """logp, entropy, and the gradients of sum(weights * chosen outputs) in hidden, weight, bias."""
    params = [t.clone().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    logp, entropy = fn(*params[:2], params[2] if bias is not None else None, targets, temperature)
    loss = sum((w * out).sum() for w, out, used in zip(weights, (logp, entropy), outputs) if used)
    grads = torch.autograd.grad(loss, params)
    return [logp, entropy, *grads]


@pytest.mark.parametrize("chunk_tokens", [1, 5, 16, 37, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("outputs", [(True, True), (True, False), (False, True)], ids=["both", "logp", "entropy"])
def test_chunked_equals_full_logits(chunk_tokens, temperature, outputs):
    hidden, weight, bias, targets, weights = leaves(with_bias=False)

    def chunked(h, w, b, t, temp):
        return chunked_logp_entropy(h, w, b, t, temp, chunk_tokens)

    expected = values_and_grads(full_logp_entropy, hidden, weight, bias, targets, weights, temperature, outputs)
    actual = values_and_grads(chunked, hidden, weight, bias, targets, weights, temperature, outputs)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=0)


def test_lm_head_bias_gets_its_gradient():
    hidden, weight, bias, targets, weights = leaves(with_bias=True)
    expected = values_and_grads(full_logp_entropy, hidden, weight, bias, targets, weights, 0.7, (True, True))
    actual = values_and_grads(lambda h, w, b, t, temp: chunked_logp_entropy(h, w, b, t, temp, 8),
                              hidden, weight, bias, targets, weights, 0.7, (True, True))
    assert len(actual) == 5                                   # logp, entropy, hidden, weight and bias grads
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=0)


def test_bf16_matmul_matches_autocast_lm_head_then_fp32_log_softmax():
    hidden, weight, _, targets, weights = leaves(with_bias=False)

    def autocast_full(h, w, b, t, temp):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return full_logp_entropy(h, w, b, t, temp)

    expected = values_and_grads(autocast_full, hidden, weight, None, targets, weights, 1.0, (True, True))
    actual = values_and_grads(lambda h, w, b, t, temp: chunked_logp_entropy(h, w, b, t, temp, 8, torch.bfloat16),
                              hidden, weight, None, targets, weights, 1.0, (True, True))
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype == torch.float32
        torch.testing.assert_close(a, e, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("chunk_tokens", [3, 1024])
def test_token_logprobs_gradients_reach_the_tied_embedding(chunk_tokens):
    """Every parameter's gradient, the embedding shared by the input and lm_head included, equals the
    full-logits one."""
    model = tiny_llama()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(V, (3, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 9:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, :4] = 0

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    logp, entropy = token_logprobs(model, input_ids, attention_mask, loss_mask, 0.8, chunk_tokens)
    chunked = grads(-(logp.sum() + 0.1 * entropy.sum()))
    hidden, targets, predicts = sampled_positions(model, input_ids, attention_mask, loss_mask)
    full_logp, full_entropy = full_logp_entropy(hidden, model.get_output_embeddings().weight, None, targets, 0.8)
    full = grads(-(full_logp.sum() + 0.1 * full_entropy.sum()))
    torch.testing.assert_close(logp[:, 1:][predicts], full_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[:, 1:][predicts], full_entropy, atol=1e-5, rtol=0)
    assert (logp[:, 1:][~predicts] == 0).all() and (logp[:, 0] == 0).all()
    assert full.keys() == chunked.keys()
    for name in full:
        torch.testing.assert_close(chunked[name], full[name], atol=1e-5, rtol=0, msg=name)


def test_no_grad_scoring_builds_no_graph_and_equals_the_grad_path():
    model = tiny_llama()
    input_ids = torch.randint(V, (2, 10), generator=torch.Generator().manual_seed(2))
    ones = torch.ones_like(input_ids)
    with torch.no_grad():
        logp, entropy = token_logprobs(model, input_ids, ones, ones, chunk_tokens=4)
    assert not logp.requires_grad and not entropy.requires_grad
    with_grad = token_logprobs(model, input_ids, ones, ones, chunk_tokens=4)
    assert with_grad[0].requires_grad
    assert torch.equal(logp, with_grad[0].detach()) and torch.equal(entropy, with_grad[1].detach())


def test_neither_actor_nor_critic_runs_the_vocabulary_head_on_all_positions():
    """The [tokens, vocab] logits would come from lm_head's forward; scoring uses its weight chunk by
    chunk instead, and the critic has no such head."""
    model = tiny_llama()
    model.get_output_embeddings().register_forward_hook(lambda *_: pytest.fail("lm_head ran on all positions"))
    critic = ValueModel.from_policy(model)
    input_ids = torch.randint(V, (2, 10), generator=torch.Generator().manual_seed(3))
    ones = torch.ones_like(input_ids)
    logp, entropy = token_logprobs(model, input_ids, ones, ones)
    (logp.sum() + entropy.sum()).backward()
    token_values(critic, input_ids, ones, ones).sum().backward()


def test_memory_benchmark_variants_agree_at_a_small_size():
    """benchmarks/memory.py's two variants (run in-process here): same log-probs, entropies, gradients."""
    model, batch = memory_benchmark.build(vocab=300, rows=2, tokens=24)
    full = memory_benchmark.logp_entropy_grads(model, batch, chunk_tokens=None)
    model.zero_grad()
    chunked = memory_benchmark.logp_entropy_grads(model, batch, chunk_tokens=16)
    assert full.keys() == chunked.keys() and "grad/model.embed_tokens.weight" in full
    for key in full:
        torch.testing.assert_close(chunked[key], full[key], atol=1e-5, rtol=0, msg=key)
