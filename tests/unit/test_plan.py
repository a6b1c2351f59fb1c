"""`horizonrl plan`: golden per-GPU bytes for Qwen2.5-3B and 7B, derived by hand in the comments, and
the suggestion logic. Sizes: V vocab, H hidden, I intermediate, L layers, kv = kv_heads x head_dim."""

import json

import pytest

from horizonrl.cli import main
from horizonrl.config import ConfigError, apply_overrides, validate
from horizonrl.plan import (GIB, Architecture, critic_network, format_plan, load_model_config, local_numel,
                            parameter_count, plan, plan_for, policy_network, sequence_length, sharded_state)

# The published config.json of the recipes' models (also shipped in horizonrl/model_configs).
QWEN_3B = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
           "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
           "intermediate_size": 11008, "max_position_embeddings": 32768, "max_window_layers": 70,
           "model_type": "qwen2", "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
           "use_sliding_window": False, "vocab_size": 151936}
QWEN_7B = {**QWEN_3B, "hidden_size": 3584, "intermediate_size": 18944, "max_window_layers": 28,
           "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "sliding_window": 131072,
           "tie_word_embeddings": False, "vocab_size": 152064}
# Verlog's settings of configs/babyai.yaml (3B) and configs/crafter.yaml (7B); the env is irrelevant here. fp32
# parameters and micro-batches of 8 rows (the defaults, auto, are bf16 and the largest token budget that fits on a
# GPU: test_mixed_precision_auto_is_on_for_gpus..., test_the_auto_token_budget_is_the_largest_that_fits).
BABYAI = ["rollout.n_env=32", "rollout.max_tokens=256", "agent.memory=1", "optim.mini_batch_size=64",
          "optim.micro_batch_size=8", "ppo.e_len=8", "optim.max_tokens_per_micro_batch=null",
          "dist.mixed_precision=false"]
CRAFTER = ["rollout.n_env=128", "rollout.max_tokens=256", "agent.memory=1", "optim.mini_batch_size=256",
           "optim.micro_batch_size=8", "ppo.e_len=16", "optim.max_tokens_per_micro_batch=null",
           "dist.mixed_precision=false"]
FAST = ["dist.activation_checkpointing=true", "dist.mixed_precision=true"]
GPU_80 = 80 * GIB   # 85,899,345,920 bytes

# Qwen2.5-3B: V 151936, H 2048, I 11008, L 36, 16 heads x 128, kv 2 x 128 = 256, tied.
#   embed V H = 311,164,928
#   layer: q 2048*2048 + 2048 (bias) = 4,196,352; k, v 2048*256 + 256 = 524,544 each; o 2048*2048 = 4,194,304;
#          gate, up, down 2048*11008 = 22,544,384 each; two norms 2*2048
#          = 4,196,352 + 1,049,088 + 4,194,304 + 67,633,152 + 4,096 = 77,076,992
#   total 311,164,928 + 36 * 77,076,992 (2,774,771,712) + 2,048 (final norm) = 3,085,938,688
N_3B, LAYER_3B, ROOT_3B = 3_085_938_688, 77_076_992, 311_164_928 + 2_048
# Qwen2.5-7B: V 152064, H 3584, I 18944, L 28, 28 heads x 128, kv 4 x 128 = 512, untied.
#   embed = lm_head = V H = 544,997,376
#   layer: q 3584^2 + 3584 = 12,848,640; k, v 3584*512 + 512 = 1,835,520 each; o 3584^2 = 12,845,056;
#          gate, up, down 3584*18944 = 67,895,296 each; norms 2*3584
#          = 12,848,640 + 3,671,040 + 12,845,056 + 203,685,888 + 7,168 = 233,057,792
#   total 2 * 544,997,376 + 28 * 233,057,792 (6,525,618,176) + 3,584 = 7,615,616,512
N_7B, LAYER_7B, ROOT_7B = 7_615_616_512, 233_057_792, 2 * 544_997_376 + 3_584


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Never ask the hub: a hub id is read from the Hugging Face cache or the shipped copy."""
    monkeypatch.setattr("horizonrl.plan._hub_resolves", lambda: False)


def run_config(tmp_path, model: dict | None, overrides: list[str]):
    """A validated TrainConfig whose model.path is a folder holding `model` as config.json."""
    raw = {}
    if model is not None:
        folder = tmp_path / "model"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(model))
        raw = {"model": {"path": str(folder)}}
    return validate(apply_overrides(raw, overrides))


def components(tmp_path, model, overrides, gpus, gpu_bytes=GPU_80):
    cfg = run_config(tmp_path, model, overrides)
    return plan_for(Architecture.from_config(model), cfg, gpus, gpu_bytes)


def test_parameter_counts_from_config_json():
    arch_3b, arch_7b = Architecture.from_config(QWEN_3B), Architecture.from_config(QWEN_7B)
    assert parameter_count(policy_network(arch_3b, None)) == N_3B
    assert parameter_count(policy_network(arch_7b, None)) == N_7B
    # critic: backbone (no lm_head: the 3B's is tied anyway) + value head 2048 + 1 bias
    assert parameter_count(critic_network(arch_3b, None)) == N_3B + 2_049
    # 7B: the untied lm_head (544,997,376) goes, the head 3584 + 1 comes
    assert parameter_count(critic_network(arch_7b, None)) == N_7B - 544_997_376 + 3_585


# Qwen2.5-3B, ppo, full fine-tune, 4 GPUs, the recipe's defaults (no mixed precision, no checkpointing, hf engine).
# Every dim divides by W = 4 except the critic's value head [1, 2048] and bias [1]: one row each on every rank.
# S = 1024 + 1 x (1024 + 256) + 256 = 2,560 tokens per row; T = 8 rows x 2,560 = 20,480 tokens.
EXPECTED_3B_4_GPUS = {
    "actor_params": N_3B // 4 * 4,                  # 771,484,672 fp32 elements a rank = 3,085,938,688 bytes
    "actor_grads": N_3B // 4 * 4,
    "actor_optimizer": N_3B // 4 * 8,               # exp_avg + exp_avg_sq = 6,171,877,376
    "critic_params": (N_3B // 4 + 2_048 + 1) * 4,   # 771,486,721 elements = 3,085,946,884
    "critic_grads": (N_3B // 4 + 2_049) * 4,
    "critic_optimizer": (N_3B // 4 + 2_049) * 8,    # 6,171,893,768
    "reference_params": N_3B // 4 * 4,              # fp32 without mixed precision
    # the critic's root (embed + norm + value head gathered from 4 padded shards: 4 x 2048 + 4) and 2 layers, fp32:
    # 4 x (311,166,976 + 8,196 + 2 x 77,076,992) = 4 x 465,329,156 = 1,861,316,624
    "gathered_params": 4 * (ROOT_3B + 8_196 + 2 * LAYER_3B),
    # the critic's root gradients fp32 (4) + their fp32 reduce-scatter input (4): 8 x 311,175,172 = 2,489,401,376
    "gradient_reduce": 8 * (ROOT_3B + 8_196),
    # b = 16H + 8q + 4 heads + 2S + 8I + 8 + 10H (fp32 residual stream)
    #   = 32,768 + 16,384 + 64 + 5,120 + 88,064 + 8 + 20,480 = 162,888 bytes a token and layer;
    # tail t = (4 + 2 x 4)H + 25 = 24,601; RoPE cos, sin 2 x 2,560 x 128 x 4 = 2,621,440
    # 20,480 x (36 x 162,888 + 24,601) + 2,621,440 = 20,480 x 5,888,569 + 2,621,440 = 120,600,514,560
    "activations": 20_480 * (36 * 162_888 + 24_601) + 2_621_440,
    # autocast's bf16 copies of the Linear weights, kept for backward: 2 x 36 x (q 2048^2 + k, v 2048 x 256
    # + o 2048^2 + gate, up, down 2048 x 11008 = 77,070,336) = 5,549,064,192
    "autocast_weights": 2 * 36 * 77_070_336,
    # 1,024 x V x (4 + 4 + 2) = 1,555,824,640, + the bf16 copy of lm_head V x H x 2 = 622,329,856
    "logits_chunk": 1_024 * 151_936 * (4 + 4 + 2) + 151_936 * 2_048 * 2,
    "engine_weights": N_3B * 2,                     # 6,171,877,376
    # 32 streams / 4 GPUs = 8 rows x 2,560 + 65,536 prefix-cache tokens = 86,016 tokens
    # x (2 x 36 layers x 2 kv heads x 128 x 2 bytes = 36,864) = 3,170,893,824
    "engine_kv": (8 * 2_560 + 65_536) * 36_864,
    "vllm_reservation": 0,
}


def test_qwen_3b_ppo_on_4_gpus_every_component(tmp_path):
    result = components(tmp_path, QWEN_3B, BABYAI, gpus=4)
    assert (result.seq_len, result.tokens, result.parameters) == (2_560, 20_480, N_3B)
    assert result.components == EXPECTED_3B_4_GPUS
    assert result.total == sum(EXPECTED_3B_4_GPUS.values()) == 169_794_703_424   # 158.13 GiB
    assert not result.fits
    assert result.suggestion.changes == ["dist.activation_checkpointing=true"]
    with_it = components(tmp_path, QWEN_3B, BABYAI + ["dist.activation_checkpointing=true"], gpus=4)
    assert with_it.fits and result.suggestion.total == with_it.total


def test_mixed_precision_auto_is_on_for_gpus_unless_precision_is_fp32(tmp_path):
    """A plan is for GPUs: dist.mixed_precision=auto plans bf16 parameters, as true does, unless precision=fp32."""
    verlog = BABYAI[:-1]
    auto = components(tmp_path, QWEN_3B, verlog, gpus=4)
    assert auto.components == components(tmp_path, QWEN_3B, verlog + ["dist.mixed_precision=true"], gpus=4).components
    assert auto.components["reference_params"] == N_3B // 4 * 2 and auto.settings["mixed_precision"] is True
    fp32 = components(tmp_path, QWEN_3B, verlog + ["precision=fp32"], gpus=4)
    assert fp32.components == EXPECTED_3B_4_GPUS and fp32.settings["mixed_precision"] is False


def test_the_auto_token_budget_is_the_largest_that_fits(tmp_path):
    """optim.max_tokens_per_micro_batch=auto (the default): the largest multiple of 256 whose plan fits the GPU less
    2 GiB; 256 more does not fit. On a GPU with room for every row of a rank's mini-batch share at once, that share:
    ceil(64 / 4) = 16 rows x S (2,560) = 40,960 tokens."""
    verlog = BABYAI[:-2]          # bf16 parameters (auto), no activation checkpointing
    auto = components(tmp_path, QWEN_3B, verlog, gpus=4)
    room = GPU_80 - 2 * GIB
    assert auto.tokens % 256 == 0 and 2_560 < auto.tokens < 40_960 and max(auto.total, auto.startup) <= room
    more = components(tmp_path, QWEN_3B, verlog + [f"optim.max_tokens_per_micro_batch={auto.tokens + 256}"], gpus=4)
    assert max(more.total, more.startup) > room
    assert components(tmp_path, QWEN_3B, verlog, gpus=4, gpu_bytes=1000 * GIB).tokens == 16 * 2_560


def test_qwen_3b_with_checkpointing_and_mixed_precision(tmp_path):
    result = components(tmp_path, QWEN_3B, BABYAI + FAST, gpus=4)
    expected = {**EXPECTED_3B_4_GPUS,
                "reference_params": N_3B // 4 * 2,                     # bf16: 1,542,969,344
                "gathered_params": 2 * (ROOT_3B + 8_196 + 2 * LAYER_3B),   # bf16: 930,658,312
                "gradient_reduce": (2 + 4) * (ROOT_3B + 8_196),        # bf16 grads + fp32 input: 1,867,051,032
                # each layer's bf16 input (L x 2H = 147,456) + one layer recomputed (b = 162,888 - 10H = 142,408)
                # + tail (8H + 25 = 16,409) = 306,273 bytes a token; RoPE 2 x 2,560 x 128 x 2 = 1,310,720
                # 20,480 x 306,273 + 1,310,720 = 6,273,781,760
                "activations": 20_480 * (36 * 2 * 2_048 + 142_408 + 16_409) + 1_310_720,
                "autocast_weights": 0,                                 # bf16 weights: nothing to cast
                "logits_chunk": 1_024 * 151_936 * (4 + 4 + 2)}         # lm_head already bf16
    assert result.components == expected
    assert result.fits and result.total == sum(expected.values()) == 46_200_598_576   # 43.03 GiB


def test_qwen_3b_start_up_holds_shards_the_engine_and_two_copies_of_the_largest_parameter(tmp_path):
    """learner/sharded_start.py: before the first step a GPU holds the stored shards (actor fp32 N/4 x 4,
    critic N/4 x 4 + its value head's padded row, bf16 reference N/4 x 2), the hf engine's bf16 copy (N x 2)
    and two fp32 copies of the embedding [V, H] (a broadcast or gathered whole parameter); rank 0's CPU
    memory holds the initial fp32 policy (N x 4)."""
    result = components(tmp_path, QWEN_3B, BABYAI + FAST, gpus=4)
    shards = N_3B // 4 * 4 + (N_3B // 4 * 4 + (2_048 + 1) * 4) + N_3B // 4 * 2
    assert result.startup == shards + N_3B * 2 + 2 * 151_936 * 2_048 * 4 == 16_376_051_716   # 15.25 GiB
    assert result.startup_host == N_3B * 4
    lora = components(tmp_path, QWEN_3B, BABYAI + FAST + ["model.lora={r: 16}"], gpus=4)
    assert lora.startup_host == 2 * N_3B * 4     # the critic's copy, with its own adapters


def test_qwen_3b_with_lora(tmp_path):
    """LoRA r=16 on the seven layer linears, mixed precision: frozen base in bf16, adapters fp32 with AdamW."""
    result = components(tmp_path, QWEN_3B, BABYAI + ["model.lora={r: 16}", "dist.mixed_precision=true"], gpus=4)
    # Adapters of a layer, A [16, in] and B [out, 16], per rank (W = 4: A has 4 of its 16 rows):
    #   q: 4*2048 + 512*16 = 16,384; k, v: 4*2048 + 64*16 = 9,216 each; o: 16,384;
    #   gate, up: 4*2048 + 2752*16 = 52,224 each; down: 4*11008 + 512*16 = 52,224
    #   = 207,872 a rank, x 36 layers = 7,483,392 elements; all ranks: 16 x 51,968 x 36 = 29,933,568
    adapters = 36 * 207_872 * 4   # fp32 bytes a rank = 29,933,568
    base = N_3B // 4 * 2          # bf16 frozen base = 1,542,969,344
    head = (2_048 + 1) * 4        # the critic's trainable value head (one padded row a rank)
    expected = {
        "actor_params": base + adapters, "actor_grads": adapters, "actor_optimizer": 2 * adapters,
        "critic_params": base + adapters + head, "critic_grads": adapters + head,
        "critic_optimizer": 2 * (adapters + head),
        "reference_params": 0,    # the actor with its adapters disabled
        # bf16: critic root 311,175,172 + 2 layers of 77,076,992 + 4 x 207,872 adapters = 933,984,264
        "gathered_params": 2 * (ROOT_3B + 8_196 + 2 * (LAYER_3B + 4 * 207_872)),
        "gradient_reduce": (2 + 4) * 4 * 207_872,   # one layer's adapter gradients: 4,988,928
        # b + 2r per adapted linear = 142,408 + 7 x 32 = 142,632; tail 16,409; RoPE 1,310,720
        "activations": 20_480 * (36 * 142_632 + 16_409) + 1_310_720,
        "autocast_weights": 0,
        "logits_chunk": 1_024 * 151_936 * (4 + 4 + 2),
        "engine_weights": N_3B * 2,   # merged weights, bf16
        "engine_kv": EXPECTED_3B_4_GPUS["engine_kv"], "vllm_reservation": 0,
    }
    assert result.components == expected
    assert result.settings["lora"] == 16


def test_cpu_offload_moves_every_sharded_state_off_the_gpu(tmp_path):
    result = components(tmp_path, QWEN_3B, BABYAI + ["dist.cpu_offload=true"], gpus=4)
    sharded = ["actor_params", "actor_grads", "actor_optimizer", "critic_params", "critic_grads",
               "critic_optimizer", "reference_params"]
    assert result.components == {**EXPECTED_3B_4_GPUS, **{key: 0 for key in sharded}}


# Qwen2.5-7B, ppo, 8 GPUs, checkpointing + mixed precision; every dim divides by 8 but the value head's.
# S = 2,560, T = 8 x 2,560 = 20,480; 128 streams / 8 GPUs = 16 rows.
EXPECTED_7B_8_GPUS = {
    "actor_params": N_7B // 8 * 4,                   # 951,952,064 elements = 3,807,808,256 bytes
    "actor_grads": N_7B // 8 * 4,
    "actor_optimizer": N_7B // 8 * 8,                # 7,615,616,512
    # backbone 7,070,619,136 / 8 = 883,827,392 + head 3,584 + bias 1 (a padded row each) = 883,830,977
    "critic_params": (883_827_392 + 3_585) * 4,      # 3,535,323,908
    "critic_grads": (883_827_392 + 3_585) * 4,
    "critic_optimizer": (883_827_392 + 3_585) * 8,   # 7,070,647,816
    "reference_params": N_7B // 8 * 2,               # bf16: 1,903,904,128
    # the actor's root (embed + lm_head + norm = 1,089,998,336) and 2 layers, bf16: 3,112,227,840
    "gathered_params": 2 * (ROOT_7B + 2 * LAYER_7B),
    "gradient_reduce": (2 + 4) * ROOT_7B,            # 6,539,990,016
    # b = 16H + 8q + 4 x 28 + 2S + 8I + 8 = 57,344 + 28,672 + 112 + 5,120 + 151,552 + 8 = 242,808;
    # L x 2H = 200,704 layer inputs; tail 8H + 25 = 28,697; RoPE 2 x 2,560 x 128 x 2 = 1,310,720
    "activations": 20_480 * (28 * 2 * 3_584 + 242_808 + 28_697) + 1_310_720,   # 9,672,151,040
    "autocast_weights": 0,
    "logits_chunk": 1_024 * 152_064 * 10,            # 1,557,135,360
    "engine_weights": N_7B * 2,                      # 15,231,233,024
    # (16 x 2,560 + 65,536) tokens x (2 x 28 x 4 x 128 x 2 = 57,344) = 6,106,906,624
    "engine_kv": (16 * 2_560 + 65_536) * 57_344,
    "vllm_reservation": 0,
}


def test_qwen_7b_ppo_on_8_gpus_with_checkpointing_and_mixed_precision(tmp_path):
    result = components(tmp_path, QWEN_7B, CRAFTER + FAST, gpus=8)
    assert result.parameters == N_7B
    assert result.components == EXPECTED_7B_8_GPUS
    assert result.fits and result.total == sum(EXPECTED_7B_8_GPUS.values()) == 73_496_076_688   # 68.45 GiB


def test_ceil_padding_when_dims_do_not_divide(tmp_path):
    """3 ranks: 151936, 2048, 256 and 11008 rows do not divide by 3; every rank allocates ceil(d0 / 3) rows."""
    arch = Architecture.from_config(QWEN_3B)
    params, grads, optimizer = sharded_state(policy_network(arch, None), 3, 4, rank=0)
    # embed ceil(151936/3) = 50,646 rows; final norm ceil(2048/3) = 683; per layer q 683 x 2048 + bias 683,
    # k, v ceil(256/3) = 86 rows x 2048 + bias 86, o 683 x 2048, gate, up ceil(11008/3) = 3,670 rows x 2048,
    # down 683 x 11008, norms 2 x 683
    layer = 683 * 2048 + 683 + 2 * (86 * 2048 + 86) + 683 * 2048 + 2 * 3670 * 2048 + 683 * 11008 + 2 * 683
    assert layer == 25_702_829
    padded = 50_646 * 2048 + 683 + 36 * layer   # 1,029,025,535 elements vs 3,085,938,688 / 3 = 1,028,646,229.3
    assert (params, grads, optimizer) == (4 * padded, 4 * padded, 8 * padded)
    # rank 2's unpadded chunk (AdamW's states): 151936 - 2 x 50646 = 50,644 rows; 2048 - 1366 = 682; 256 - 172 = 84;
    # 11008 - 7340 = 3,668
    layer_2 = 682 * 2048 + 682 + 2 * (84 * 2048 + 84) + 682 * 2048 + 2 * 3668 * 2048 + 682 * 11008 + 2 * 682
    assert sharded_state(policy_network(arch, None), 3, 4, rank=2) == \
        (4 * padded, 4 * padded, 8 * (50_644 * 2048 + 682 + 36 * layer_2))
    assert local_numel((1, 2048), 3, 1) == 0      # the value head's single row is on rank 0 only


def test_group_algorithm_has_no_critic_and_samples_its_episodes(tmp_path):
    result = components(tmp_path, QWEN_3B, BABYAI + ["algorithm=grpo", "rollout.n_env=16"], gpus=4)
    assert result.components["critic_params"] == result.components["critic_optimizer"] == 0
    # the actor's root (no value head) and 2 layers, fp32; its root gradients + reduce-scatter input
    assert result.components["gathered_params"] == 4 * (ROOT_3B + 2 * LAYER_3B)
    assert result.components["gradient_reduce"] == 8 * ROOT_3B
    # 8 tasks x 8 rollouts = 64 episodes on 16 env handles: 16 at once, 4 a GPU: (4 x 2,560 + 65,536) x 36,864
    assert result.components["engine_kv"] == (4 * 2_560 + 65_536) * 36_864


def test_vllm_reserves_its_share_and_openai_needs_nothing(tmp_path):
    cfg = run_config(tmp_path, QWEN_3B, BABYAI)
    vllm = cfg.rollout.model_copy(update={"engine": "vllm"})   # (vLLM itself need not be installed to plan)
    result = plan_for(Architecture.from_config(QWEN_3B), cfg.model_copy(update={"rollout": vllm}), 4, GPU_80)
    assert (result.components["engine_weights"], result.components["engine_kv"]) == (0, 0)
    assert result.components["vllm_reservation"] == GPU_80 // 2     # 0.5 x 80 GiB
    result = components(tmp_path, QWEN_3B, BABYAI + ["rollout.engine=openai"], gpus=4)
    assert result.components["engine_weights"] == result.components["engine_kv"] == 0


def test_a_producer_process_holds_a_second_engine_copy(tmp_path):
    asynchronous = BABYAI + ["rollout.async_training.max_staleness=1", "actor.tis_cap=1.0"]
    thread = components(tmp_path, QWEN_3B, asynchronous, gpus=4)
    process = components(tmp_path, QWEN_3B, asynchronous + ["rollout.async_training.producer=process"], gpus=4)
    assert thread.components["engine_weights"] == N_3B * 2                  # bf16
    assert process.components["engine_weights"] == 2 * N_3B * 2             # + the staging copy


def test_sequence_length_rules(tmp_path):
    arch = Architecture.from_config(QWEN_3B)
    assert sequence_length(run_config(tmp_path, QWEN_3B, BABYAI), arch)[0] == 1024 + (1024 + 256) + 256
    assert sequence_length(run_config(tmp_path, QWEN_3B, ["agent.memory=2", "rollout.max_tokens=100"]), arch)[0] \
        == 1024 + 2 * (1024 + 100) + 100
    full = run_config(tmp_path, QWEN_3B, ["agent.history=full"])
    assert sequence_length(full, arch)[0] == 32_768     # a whole episode, up to the context
    merged = run_config(tmp_path, QWEN_3B, ["agent.history=full", "samples=merged", "merge.max_prompt_len=2048",
                                            "merge.max_response_len=4096"])
    assert sequence_length(merged, arch)[0] == 2048 + 4096
    task = run_config(tmp_path, QWEN_3B, ["algorithm=grpo", "task.source=horizonrl.tasks.arithmetic:make_task",
                                          "task.max_total_tokens=512"])
    assert sequence_length(task, arch)[0] == 1024 + 512
    tiny = run_config(tmp_path, None, ["rollout.max_tokens=256"])    # the tiny model's context: 2048
    tokens, rule = sequence_length(tiny, Architecture.from_config(load_model_config(tiny)[0]))
    assert tokens == 2048 and "capped" in rule
    budget = components(tmp_path, QWEN_3B, BABYAI + ["optim.max_tokens_per_micro_batch=1000"], gpus=4)
    assert budget.tokens == 2_560     # a row longer than the budget is a micro-batch alone


def test_a_smaller_token_budget_when_checkpointing_is_not_enough(tmp_path):
    big = BABYAI + ["optim.mini_batch_size=256", "optim.micro_batch_size=512"]   # T = 512 x 2,560 = 1,310,720
    result = components(tmp_path, QWEN_3B, big, gpus=4)
    assert not components(tmp_path, QWEN_3B, big + ["dist.activation_checkpointing=true"], gpus=4).fits
    # Without activations, autocast weights and logits the 4-GPU plan holds 41,466,970,176 bytes (the other
    # components of EXPECTED_3B_4_GPUS); 80 GiB leaves 85,899,345,920 - 41,466,970,176 - 2,178,154,496 (logits)
    # - 5,549,064,192 (autocast weights) - 2,621,440 (RoPE) = 36,702,535,616 bytes for activations at
    # 36 x 162,888 + 24,601 = 5,888,569 bytes a token: 6,232 tokens, 6,144 in multiples of 256.
    assert result.suggestion.changes == ["optim.max_tokens_per_micro_batch=6144"]
    assert not result.suggestion.combination
    assert not components(tmp_path, QWEN_3B, big + ["optim.max_tokens_per_micro_batch=6400"], gpus=4).fits


def test_the_cheapest_combination_when_no_single_change_fits(tmp_path):
    full = BABYAI + ["agent.history=full"]       # S = 32,768: T = 262,144; KV (8 x 32,768 + 65,536) x 36,864
    result = components(tmp_path, QWEN_3B, full, gpus=4)
    for single in ["dist.activation_checkpointing=true", "optim.max_tokens_per_micro_batch=32768",
                   "model.lora={r: 16}", "dist.cpu_offload=true"]:
        assert not components(tmp_path, QWEN_3B, full + [single], gpus=4).fits, single
    # Checkpointing + a budget: the rest is 41,466,970,176 - 3,170,893,824 + 12,079,595,520 (the KV of 32k rows)
    # = 50,375,671,872 bytes; 85,899,345,920 - 50,375,671,872 - 2,178,154,496 (logits) - 154,140,672 (one
    # layer's autocast weights) - 33,554,432 (RoPE, 2 x 32,768 x 128 x 4) = 33,157,824,448 bytes left at
    # L x 4H + b + t = 294,912 + (162,888 + 2 x (32,768 - 2,560)) + 24,601 = 542,817 bytes a token:
    # 61,083 tokens, 60,928 in multiples of 256.
    assert result.suggestion.changes == ["dist.activation_checkpointing=true",
                                         "optim.max_tokens_per_micro_batch=60928"]
    assert result.suggestion.combination
    assert result.suggestion.total == components(tmp_path, QWEN_3B, full + result.suggestion.changes, gpus=4).total


def test_more_gpus_when_nothing_else_is_left(tmp_path):
    """Everything else already on: only more GPUs shrink the engine's KV (its rows are streams / GPUs)."""
    on = ["rollout.n_env=256", "dist.activation_checkpointing=true", "dist.cpu_offload=true", "model.lora={r: 16}",
          "optim.max_tokens_per_micro_batch=2560"]
    result = components(tmp_path, QWEN_3B, BABYAI + on, gpus=1, gpu_bytes=16 * GIB)
    (change,) = result.suggestion.changes
    gpus = int(change.removeprefix("--gpus "))
    assert components(tmp_path, QWEN_3B, BABYAI + on, gpus=gpus, gpu_bytes=16 * GIB).fits
    assert not components(tmp_path, QWEN_3B, BABYAI + on, gpus=gpus - 1, gpu_bytes=16 * GIB).fits


def test_nothing_fits_a_gpu_smaller_than_the_engine_copy(tmp_path):
    result = components(tmp_path, QWEN_3B, BABYAI, gpus=4, gpu_bytes=4 * GIB)   # bf16 weights alone: 5.75 GiB
    assert not result.fits and result.suggestion is None
    assert "no change among" in format_plan(result)


def test_model_config_sources(tmp_path, caplog):
    tiny = run_config(tmp_path, None, [])
    assert load_model_config(tiny) == ({"model_type": "llama", "vocab_size": 1024, "hidden_size": 64,
                                        "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4,
                                        "num_key_value_heads": 2, "max_position_embeddings": 2048,
                                        "tie_word_embeddings": True}, "model.tiny")
    builtin = validate({"model": {"path": "builtin:babyai-tiny"}})
    assert Architecture.from_config(load_model_config(builtin)[0]).hidden == 128
    for name, published in [("Qwen/Qwen2.5-3B-Instruct", QWEN_3B), ("Qwen/Qwen2.5-7B-Instruct", QWEN_7B)]:
        with caplog.at_level("INFO", logger="horizonrl.plan"):
            config, source = load_model_config(validate({"model": {"path": name}}))
        if source.startswith("shipped"):     # (a machine whose Hugging Face cache has it reads that)
            assert config == published
            assert "using the copy of its config.json shipped" in caplog.text
    with pytest.raises(ConfigError, match="cannot read nobody/no-such-model's config.json"):
        load_model_config(validate({"model": {"path": "nobody/no-such-model"}}))
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        Architecture.from_config({**QWEN_3B, "model_type": "gpt2"})


def test_plan_reads_the_model_folder(tmp_path):
    cfg = run_config(tmp_path, QWEN_3B, BABYAI)
    result = plan(cfg, 4, 80.0)
    assert result.components == EXPECTED_3B_4_GPUS and result.model_source.endswith("config.json")


def test_cli_prints_a_table_and_json(tmp_path, capsys):
    run_config(tmp_path, QWEN_3B, [])   # writes tmp_path/model/config.json
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model:\n  path: {tmp_path / 'model'}\n")
    assert main(["plan", str(recipe), *BABYAI, "--gpus", "4"]) == 0
    table = capsys.readouterr().out
    assert "actor optimizer                     5.75" in table
    assert "total                             158.13" in table
    assert "smallest change: dist.activation_checkpointing=true" in table
    assert main(["plan", str(recipe), *BABYAI, *FAST, "--gpus", "4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["fits"] and printed["suggestion"] is None
    assert printed["components"]["activations"] == 6_273_781_760
    assert main(["plan", str(recipe), "model.lora.rank=4", "--gpus", "4"]) == 2     # a config error
    assert "model.lora" in capsys.readouterr().err
