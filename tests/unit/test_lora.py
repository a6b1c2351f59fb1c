"""LoRA through PEFT: merged weights for the engine, the reference as the actor with adapters off,
scoring through the adapters, gradients on adapters only, the critic's adapters, checkpoints, export."""

import copy

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM, LlamaConfig

from horizonrl.config import LoRAConfig
from horizonrl.learner.lora import (adapters_disabled, add_critic_lora, add_lora, lm_body,
                                    merged_parameters, save_adapters)
from horizonrl.learner.models import ValueModel
from horizonrl.learner.scoring import token_logprobs

LORA = LoRAConfig(r=4, alpha=8.0)            # scaling alpha / r = 2; every attention and MLP projection
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_llama() -> torch.nn.Module:
    config = LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def perturb_adapters(model: torch.nn.Module, seed: int = 1) -> None:
    """PEFT starts B at 0 (the adapted model equals the base); random B makes the adapters matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))


@pytest.fixture()
def plain():
    return tiny_llama()


@pytest.fixture()
def peft_model(plain):
    model = add_lora(copy.deepcopy(plain), LORA).eval()
    perturb_adapters(model)
    return model


def batch():
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(2, 101, (2, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0                               # row 1 right-padded
    loss_mask = torch.zeros_like(input_ids)
    loss_mask[0, 4:8] = 1
    loss_mask[0, 10:] = 1
    loss_mask[1, 3:9] = 1
    return input_ids, attention_mask, loss_mask


def hand_merge(plain, peft_model) -> dict[str, torch.Tensor]:
    """The plain model's state dict with W + alpha / r * B @ A on every targeted projection."""
    adapted = peft_model.get_base_model()
    out = {}
    for name, tensor in plain.state_dict().items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in TARGETS:
            layer = adapted.get_submodule(module)
            b, a = layer.lora_B["default"].weight, layer.lora_A["default"].weight
            tensor = tensor + LORA.alpha / LORA.r * b @ a
        out[name] = tensor
    return out


def logits(model, input_ids, attention_mask):
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask).logits


def test_merged_parameters_are_the_hand_merge_under_the_plain_names(plain, peft_model):
    merged = list(merged_parameters(peft_model))
    names = [name for name, _ in merged]
    assert names == list(plain.state_dict().keys())          # lm_head.weight included, as for a tied model
    assert "lm_head.weight" in names
    expected = hand_merge(plain, peft_model)
    unloaded = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    changed = 0
    for name, tensor in merged:
        assert not tensor.requires_grad
        assert (tensor - expected[name]).abs().max() <= 1e-6, name
        assert (tensor - unloaded[name]).abs().max() <= 1e-6, name
        changed += not torch.equal(tensor, plain.state_dict()[name])
    assert changed == 2 * len(TARGETS)                       # every projection of both layers, nothing else
    merged = dict(merged)
    assert torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])


def test_merged_parameters_of_a_plain_model_are_its_state_dict(plain):
    merged = list(merged_parameters(plain))
    state = plain.state_dict()
    assert [name for name, _ in merged] == list(state.keys())
    assert all(torch.equal(tensor, state[name]) for name, tensor in merged)


def test_adapters_disabled_is_the_base_model(plain, peft_model):
    input_ids, attention_mask, _ = batch()
    base = logits(plain, input_ids, attention_mask)
    assert not torch.allclose(logits(peft_model, input_ids, attention_mask), base)
    with adapters_disabled(peft_model):
        assert torch.equal(logits(peft_model, input_ids, attention_mask), base)
    assert not torch.allclose(logits(peft_model, input_ids, attention_mask), base)   # back on after
    with adapters_disabled(plain):
        assert torch.equal(logits(plain, input_ids, attention_mask), base)


def test_lm_body_returns_hidden_states_through_the_adapters(plain, peft_model):
    assert lm_body(plain) is plain.model
    input_ids, attention_mask, _ = batch()
    hidden = lm_body(peft_model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert hidden.shape == (2, 12, 32)
    head = peft_model.get_output_embeddings()
    assert torch.allclose(head(hidden), logits(peft_model, input_ids, attention_mask), atol=1e-6)


def test_token_logprobs_of_a_peft_model(plain, peft_model):
    input_ids, attention_mask, loss_mask = batch()
    with torch.no_grad():
        logp, _ = token_logprobs(peft_model, input_ids, attention_mask, loss_mask)
    own = torch.log_softmax(logits(peft_model, input_ids, attention_mask)[:, :-1], dim=-1)
    own = own.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    sampled = loss_mask[:, 1:].bool()
    assert torch.allclose(logp[:, 1:][sampled], own[sampled], atol=1e-5)
    assert torch.all(logp[:, 1:][~sampled] == 0) and torch.all(logp[:, 0] == 0)

    with torch.no_grad():
        with adapters_disabled(peft_model):
            reference, _ = token_logprobs(peft_model, input_ids, attention_mask, loss_mask)
        base, _ = token_logprobs(plain, input_ids, attention_mask, loss_mask)
    assert torch.equal(reference, base)
    assert not torch.allclose(logp, base)


def test_only_adapters_train_and_only_they_get_gradients(peft_model):
    trainable = {name for name, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    assert len(trainable) == 2 * 2 * len(TARGETS)          # A and B, 2 layers, 7 projections

    input_ids, attention_mask, loss_mask = batch()
    logp, _ = token_logprobs(peft_model, input_ids, attention_mask, loss_mask)
    logp.sum().backward()
    for name, param in peft_model.named_parameters():
        if name in trainable:
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.grad is None, name


def test_critic_adapters(plain):
    critic = ValueModel(copy.deepcopy(plain.model), hidden_size=32).eval()
    with torch.no_grad():
        critic.value_head.weight.normal_(generator=torch.Generator().manual_seed(3))
    input_ids, attention_mask, _ = batch()
    with torch.no_grad():
        before = critic(input_ids, attention_mask)
        critic = add_critic_lora(critic, LORA)
        assert torch.equal(critic(input_ids, attention_mask), before)          # B = 0
        perturb_adapters(critic)
        after = critic(input_ids, attention_mask)
    assert not torch.allclose(after, before)
    trainable = {name for name, p in critic.named_parameters() if p.requires_grad}
    assert {"value_head.weight", "value_head.bias"} <= trainable
    assert all(name.startswith("value_head.") or "lora_" in name for name in trainable)
    assert len(trainable) == 2 + 2 * 2 * len(TARGETS)


def test_critic_adapters_round_trip(plain, tmp_path):
    critic = add_critic_lora(ValueModel(copy.deepcopy(plain.model), hidden_size=32), LORA).eval()
    perturb_adapters(critic)
    torch.nn.init.normal_(critic.value_head.weight)
    save_adapters(critic.backbone, tmp_path)
    fresh = ValueModel(copy.deepcopy(plain.model), hidden_size=32).eval()
    fresh.backbone = PeftModel.from_pretrained(fresh.backbone, str(tmp_path), is_trainable=True)
    fresh.value_head.load_state_dict(critic.value_head.state_dict())
    input_ids, attention_mask, _ = batch()
    with torch.no_grad():
        assert torch.equal(fresh(input_ids, attention_mask), critic(input_ids, attention_mask))


def test_save_and_load_adapters(plain, peft_model, tmp_path):
    save_adapters(peft_model, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"adapter_model.safetensors", "adapter_config.json"}
    with safe_open(str(tmp_path / "adapter_model.safetensors"), "pt") as saved:
        keys = list(saved.keys())
    assert len(keys) == 2 * 2 * len(TARGETS) and all("lora_A" in k or "lora_B" in k for k in keys)

    loaded = PeftModel.from_pretrained(copy.deepcopy(plain), str(tmp_path), is_trainable=True).eval()
    input_ids, attention_mask, _ = batch()
    assert torch.equal(logits(loaded, input_ids, attention_mask), logits(peft_model, input_ids, attention_mask))
    assert {n for n, p in loaded.named_parameters() if p.requires_grad} == \
        {n for n, p in peft_model.named_parameters() if p.requires_grad}
