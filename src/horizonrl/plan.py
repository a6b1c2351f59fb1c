"""`horizonrl plan CONFIG --gpus G`: the GPU memory one rank of a training run needs, from the model's
config.json alone (no weights), whether it fits, and else the smallest change that makes it fit.

The run (learner/distributed.shard): torchrun, one rank per GPU, world size G. Each rank applies FSDP2's
`fully_shard` to every decoder layer and then to the root module, for the actor, the critic (ppo) and
the reference (--gpus 1 too: one rank). W = G ranks share each parameter (W = 1 with dist.shard=false),
f = 2 bytes with mixed precision (bf16: dist.mixed_precision true, or auto, which is on on CUDA unless
precision=fp32), else 4. Figures are for rank 0, which holds the most.
LoRA's frozen base weights are stored in f bytes (bf16 with mixed precision), its adapters in fp32.

Sharding. FSDP2 cuts a parameter of shape [d0, ...] on dim 0 with torch.chunk, padded to W chunks of
ceil(d0 / W) rows. Every rank allocates the padded chunk for the parameter (`_sharded_param_data`) and
for its gradient (a view into its group's padded reduce-scatter output):
    sharded(p) = ceil(d0 / W) * numel(p) / d0
AdamW's exp_avg and exp_avg_sq are `zeros_like` the *unpadded* local shard, min(ceil(d0/W), d0 - r ceil(d0/W))
rows on rank r: on rank 0 that is sharded(p), on the last ranks it may be less (even 0 rows).
tests/integration/test_plan_fsdp.py checks all three against a real 2-rank FSDP2 run.

Bytes per GPU (0 for the first seven with dist.cpu_offload: CPU memory):
    actor params        sum sharded(p) x 4 (fp32 master weights; with LoRA the frozen base x f, the adapters x 4)
    actor grads         sum over trainable p of sharded(p) x 4
    actor optimizer     sum over trainable p of local(p) x 8 (exp_avg + exp_avg_sq, fp32)
    critic params/grads/optimizer   the same for backbone + value head Linear(H, 1) (algorithm=ppo only;
                        with LoRA: a frozen backbone copy, adapters, a trainable value head)
    reference params    sum sharded(p) x f (none with LoRA: the actor with its adapters disabled)
    gathered params     f x W x (root + 2 layers): FSDP2 keeps the root's parameters (embeddings, final
                        norm, lm_head or value head) gathered from the root's forward to its backward's
                        end, and one layer's while it computes plus the next one's (prefetch); the largest
                        of actor, critic and reference
    gradient reduce     (f + 4) x W x the largest trainable FSDP unit: in backward its unsharded gradients
                        (in the compute dtype) and their fp32 reduce-scatter input
    activations         what autograd keeps for one micro-batch's backward (below)
    autocast weights    without mixed precision, autocast's bf16 copy of every Linear weight, kept for
                        backward: 2 x (one layer's Linear weights) x L (x 1 with activation checkpointing)
    logits chunk        min(1024, T) x V x (4 + 4 + 2): one chunk's fp32 log-softmax and exp and its bf16
                        matmul output (learner/chunked_logits.py), + V x H x 2 without mixed precision
                        (the bf16 copy of lm_head it multiplies with)
    engine weights      rollout.engine=hf: a full bf16 copy of the policy per rank (adapters merged): N x 2;
                        two with a producer process (rollout.async_training.producer: process)
    engine KV cache     hf: (rows x S + rollout.prefix_cache_tokens) x 2 (K, V) x L x kv_heads x head_dim x 2,
                        rows = min(ceil(streams / G), rollout.max_batch_size) sequences decoding at once
    vLLM reservation    rollout.engine=vllm: rollout.vllm.gpu_memory_utilization (None: 0.5) x GPU memory
                        (weights and KV); rollout.engine=openai: 0 (a separate server)
Start-up (learner/sharded_start.py), before the first step: the device holds the parameters of actor,
critic and reference (as above), the engine's weights, and two fp32 copies of the largest whole
parameter: a parameter is broadcast from rank 0 one at a time, and the engine's copy is filled one
gathered parameter at a time (DTensor.full_tensor: its all-gather buffer and the tensor it returns). Rank 0's CPU
memory holds the initial policy in fp32 until the shards are filled (N x 4; with LoRA and a critic, the critic's
copy too). `fits` is for the larger of start-up and steady state.
Not counted: the CUDA context and allocator fragmentation (leave ~2 GiB), the scalar AdamW step, the
flat all-gather buffer FSDP2 copies a unit's parameters out of (freed at once).

Activations, counted tensor by tensor as Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", sec. 4.1) do, for the transformers Llama/Qwen2 layer as the learner runs it
(SDPA attention, bf16 autocast on the GPU, right-padded rows with an attention mask), s = 2 bytes with
mixed precision (the residual stream is bf16), else 4 (fp32). Bytes one token keeps in one layer:
    b = 2 x 8H     each RMSNorm: its fp32 upcast input 4H, the normalised bf16 2H, its output 2H (the
                   input of q/k/v, gate/up)
      + 8q         q, k, v (k and v repeated to n_heads when a mask is given) and the attention output,
                   bf16, q = n_heads x head_dim
      + 4 n_heads  the attention's fp32 log-sum-exp
      + 2S         the [rows, 1, S, S] bf16 mask of the layer (T / S rows): the s^2 term SDPA keeps
      + 8I         gate and up outputs, SiLU(gate), SiLU(gate) x up (down_proj's input), bf16
      + 8          the norms' fp32 reciprocal RMS
      + 10H        without mixed precision: the norms keep fp32 (not bf16) normalised values (2 x 2H more)
                   and autocast keeps a bf16 copy of the input of each of q, k, v, gate, up (5 x 2H)
      + 2r         per LoRA-adapted linear, its A x (with LoRA the count is an upper bound: frozen
                   linears keep no input for a weight gradient)
The model's tail keeps t = (4 + 2s)H + 25 bytes a token: the final norm's fp32 upcast 4H, its normalised
output sH, the hidden states of the predicting positions sH (at most T), ids, targets, entropies, mask;
and RoPE's cos and sin, 2 x S x head_dim x s bytes a micro-batch:
    T x (L b + t) + 2 S head_dim s without activation checkpointing;
    T x (L s H + b + t) + 2 S head_dim s with it (each layer's input kept, one layer recomputed at a time).
tests/integration/test_plan_fsdp.py measures b, s H and t with autograd's saved-tensor hooks on the CPU
(bf16 autocast there too). With rows of equal length no mask is built: then k, v are not repeated and the
2S term is absent, so the count is an upper bound.
T tokens per micro-batch: optim.max_tokens_per_micro_batch when set (at least one row), else
optim.micro_batch_size x S. Its default, auto, is the largest budget (a multiple of 256, at most a rank's share
of a mini-batch) whose plan fits the GPU less 2 GiB (CUDA_RESERVE); the run resolves it the same way from its
GPU's memory (assembly/context.micro_batch_budget), and a CPU run has none (micro_batch_size rows).

S tokens per row (and per engine sequence), estimated from the config (--seq-len sets it):
    window history (default): 1024 (system prompt + observation; Qwen2.5's tokenizer gives 342 for
        BabyAI goto, 418 BabaIsAI, 780 Crafter) + agent.memory x (1024 + rollout.max_tokens) (each
        remembered observation and response) + rollout.max_tokens (the response);
    agent-loop task: 1024 + task.max_total_tokens;
    agent.history=full: merge.max_prompt_len + merge.max_response_len when both are set, else the
        model's context (a row may hold the whole episode);
    capped at the model's context (rollout.vllm.max_model_len with vLLM, else max_position_embeddings).
Streams: rollout.n_env (ppo); n_tasks x group_size episodes (agent-loop tasks), at most n_env (envs).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from math import prod
from pathlib import Path
from urllib.parse import urlparse

from horizonrl.algos.registry import Batches, algorithm
from horizonrl.config import ConfigError, LoRAConfig, TinyModel, TrainConfig
from horizonrl.learner.chunked_logits import LOGIT_CHUNK_TOKENS

log = logging.getLogger(__name__)

GIB = 2 ** 30
FP32, BF16 = 4, 2
ADAMW_STATES = 2                     # exp_avg, exp_avg_sq
PROMPT_TOKENS = 1024                 # system prompt + one observation, rounded up
VLLM_GPU_MEMORY_UTILIZATION = 0.5    # config.VLLMOptions' default on a GPU
MAX_GPUS = 4096
SHIPPED_CONFIGS = Path(__file__).parent / "model_configs"   # config.json of the recipes' hub models
CUDA_RESERVE = 2 * GIB               # the CUDA context and allocator fragmentation, which the plan leaves out
ARCHITECTURES = ("llama", "qwen2", "mistral")
LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DIST_FLAGS = ("shard", "mixed_precision", "activation_checkpointing", "cpu_offload")
CHANGES = ("activation_checkpointing", "token_budget", "lora", "cpu_offload", "gpus")   # cheapest first
COMPONENTS = {   # key -> table label
    "actor_params": "actor params", "actor_grads": "actor grads", "actor_optimizer": "actor optimizer",
    "critic_params": "critic params", "critic_grads": "critic grads", "critic_optimizer": "critic optimizer",
    "reference_params": "reference params", "gathered_params": "gathered params (transient)",
    "gradient_reduce": "gradient reduce (transient)", "activations": "activations",
    "autocast_weights": "autocast weights", "logits_chunk": "logits chunk",
    "engine_weights": "engine weights", "engine_kv": "engine KV cache", "vllm_reservation": "vLLM reservation",
}


@dataclass(frozen=True)
class Architecture:
    """The sizes of a Llama / Qwen2 / Mistral causal LM that its memory depends on (config.json keys)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool      # qwen2 always; llama with attention_bias
    o_bias: bool        # llama with attention_bias
    mlp_bias: bool      # llama with mlp_bias
    context: int

    @classmethod
    def from_config(cls, config: dict) -> Architecture:
        model_type = config.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"model_type {model_type!r}: the planner knows the {', '.join(ARCHITECTURES)} layouts")
        try:
            hidden, heads = config["hidden_size"], config["num_attention_heads"]
            llama_bias = model_type == "llama" and bool(config.get("attention_bias"))
            return cls(vocab=config["vocab_size"], hidden=hidden, intermediate=config["intermediate_size"],
                       layers=config["num_hidden_layers"], heads=heads,
                       kv_heads=config.get("num_key_value_heads") or heads,
                       head_dim=config.get("head_dim") or hidden // heads,
                       tied=bool(config.get("tie_word_embeddings", False)),
                       qkv_bias=model_type == "qwen2" or llama_bias, o_bias=llama_bias,
                       mlp_bias=model_type == "llama" and bool(config.get("mlp_bias")),
                       context=config["max_position_embeddings"])
        except KeyError as missing:
            raise ValueError(f"config.json has no {missing} key") from None


@dataclass(frozen=True)
class Param:
    shape: tuple[int, ...]
    trainable: bool = True


@dataclass(frozen=True)
class Network:
    """A model as FSDP2 holds it: `root`, the parameters fully_shard(model) owns (embeddings, final
    norm, lm_head or value head), and `layers` decoder layers of parameters `layer` (fully_shard(layer))."""

    root: tuple[Param, ...]
    layer: tuple[Param, ...]
    layers: int

    def total(self, per_param) -> int:
        return sum(map(per_param, self.root)) + self.layers * sum(map(per_param, self.layer))

    def frozen(self) -> Network:
        def freeze(params):
            return tuple(Param(p.shape, trainable=False) for p in params)
        return Network(freeze(self.root), freeze(self.layer), self.layers)


def linear_shapes(arch: Architecture) -> dict[str, tuple[int, int]]:
    """(out, in) of each nn.Linear of a decoder layer."""
    q, kv, h, i = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.hidden, arch.intermediate
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}


def lora_targets(lora: LoRAConfig | None) -> tuple[str, ...]:
    """The decoder-layer linears that get adapters ("all-linear": every one; PEFT leaves lm_head out)."""
    if lora is None:
        return ()
    if lora.target_modules == "all-linear":
        return LAYER_LINEARS
    targets = tuple(name for name in LAYER_LINEARS if name in lora.target_modules)
    if not targets:
        raise ValueError(f"model.lora.target_modules {lora.target_modules} names none of {', '.join(LAYER_LINEARS)}")
    return targets


def decoder_layer(arch: Architecture, lora: LoRAConfig | None) -> tuple[Param, ...]:
    """One layer's parameters: q/k/v/o and gate/up/down weights (and biases), two RMSNorm weights; with
    LoRA these are frozen and each targeted Linear(in, out) gains trainable A [r, in] and B [out, r]."""
    base, targets = lora is None, lora_targets(lora)
    biased = {"q_proj": arch.qkv_bias, "k_proj": arch.qkv_bias, "v_proj": arch.qkv_bias, "o_proj": arch.o_bias,
              "gate_proj": arch.mlp_bias, "up_proj": arch.mlp_bias, "down_proj": arch.mlp_bias}
    params = []
    for name, (out, in_) in linear_shapes(arch).items():
        params.append(Param((out, in_), base))
        if biased[name]:
            params.append(Param((out,), base))
        if name in targets:
            params += [Param((lora.r, in_)), Param((out, lora.r))]
    return (*params, Param((arch.hidden,), base), Param((arch.hidden,), base))


def policy_network(arch: Architecture, lora: LoRAConfig | None) -> Network:
    """The causal LM: root = embeddings [V, H], final norm [H], lm_head [V, H] unless tied to the embeddings."""
    base = lora is None
    root = [Param((arch.vocab, arch.hidden), base), Param((arch.hidden,), base)]
    if not arch.tied:
        root.append(Param((arch.vocab, arch.hidden), base))
    return Network(tuple(root), decoder_layer(arch, lora), arch.layers)


def critic_network(arch: Architecture, lora: LoRAConfig | None) -> Network:
    """The critic: the policy's backbone (no lm_head) and a trainable value head Linear(H, 1) with bias."""
    base = lora is None
    root = (Param((arch.vocab, arch.hidden), base), Param((arch.hidden,), base), Param((1, arch.hidden)), Param((1,)))
    return Network(root, decoder_layer(arch, lora), arch.layers)


def parameter_count(network: Network) -> int:
    return network.total(lambda p: prod(p.shape))


def sharded_numel(shape: tuple[int, ...], world: int) -> int:
    """Elements every rank allocates for a parameter (and its gradient): ceil(d0 / W) rows of dim 0."""
    return -(-shape[0] // world) * prod(shape[1:])


def local_numel(shape: tuple[int, ...], world: int, rank: int) -> int:
    """Elements of rank `rank`'s unpadded shard (torch.chunk): what AdamW's states are `zeros_like`."""
    rows = -(-shape[0] // world)
    return max(0, min(rows, shape[0] - rank * rows)) * prod(shape[1:])


def sharded_state(network: Network, world: int, frozen_bytes: int, rank: int = 0) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes rank `rank` allocates: trainable parameters fp32 with fp32
    gradients and AdamW's two fp32 states, frozen ones `frozen_bytes` each and nothing else."""
    def params(p):
        return sharded_numel(p.shape, world) * (FP32 if p.trainable else frozen_bytes)

    def grads(p):
        return sharded_numel(p.shape, world) * FP32 if p.trainable else 0

    def optimizer(p):
        return local_numel(p.shape, world, rank) * FP32 * ADAMW_STATES if p.trainable else 0

    return network.total(params), network.total(grads), network.total(optimizer)


def unit_numel(params: tuple[Param, ...], world: int, trainable_only: bool = False) -> int:
    """Elements of an FSDP unit once all-gathered: W padded shards of each parameter."""
    return sum(world * sharded_numel(p.shape, world) for p in params if p.trainable or not trainable_only)


def gathered_bytes(network: Network, world: int, compute_bytes: int) -> int:
    """The root's gathered parameters plus those of the layer computing and the next one (prefetch)."""
    return compute_bytes * (unit_numel(network.root, world) + min(2, network.layers) * unit_numel(network.layer, world))


def reduce_bytes(network: Network, world: int, compute_bytes: int) -> int:
    """The largest unit's unsharded gradients (compute dtype) with their fp32 reduce-scatter input."""
    largest = max(unit_numel(network.root, world, True), unit_numel(network.layer, world, True))
    return (compute_bytes + FP32) * largest


def layer_activation_bytes(arch: Architecture, lora: LoRAConfig | None, seq_len: int, mixed_precision: bool) -> int:
    """b = 16H + 8q + 4 n_heads + 2S + 8I + 8 (+ 10H without mixed precision) (+ 2r x LoRA targets)."""
    q = arch.heads * arch.head_dim
    adapters = 2 * lora.r * len(lora_targets(lora)) if lora else 0
    fp32_extras = 0 if mixed_precision else 10 * arch.hidden
    return 16 * arch.hidden + 8 * q + 4 * arch.heads + 2 * seq_len + 8 * arch.intermediate + 8 + fp32_extras + adapters


def activation_bytes(arch: Architecture, lora: LoRAConfig | None, tokens: int, seq_len: int, checkpointing: bool,
                     mixed_precision: bool) -> int:
    """T x (L b + t) + 2 S head_dim s, or T x (L s H + b + t) + 2 S head_dim s with activation checkpointing;
    t = (4 + 2s)H + 25."""
    stream = BF16 if mixed_precision else FP32
    b = layer_activation_bytes(arch, lora, seq_len, mixed_precision)
    tail = (4 + 2 * stream) * arch.hidden + 25
    kept = arch.layers * stream * arch.hidden + b if checkpointing else arch.layers * b
    return tokens * (kept + tail) + 2 * seq_len * arch.head_dim * stream


def saved_for_backward(run: Callable[[], object], model) -> tuple[object, int]:
    """(run(), bytes of the distinct storages autograd saves for backward while it runs, other than
    `model`'s parameters (a sharded DTensor's local shard)): what `activation_bytes` counts, each storage
    once however many saved tensors view it. The measurement behind the activation figures' tests."""
    import torch
    from torch.distributed.tensor import DTensor

    parameters = {(p.to_local() if isinstance(p, DTensor) else p).untyped_storage().data_ptr()
                  for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run()
    return out, sum(saved.values())


def autocast_weight_bytes(arch: Architecture, lora: LoRAConfig | None, checkpointing: bool,
                          mixed_precision: bool) -> int:
    """Without mixed precision: 2 x one layer's Linear weights (adapters included) x L, or x 1 with checkpointing."""
    if mixed_precision:
        return 0
    weights = sum(p.shape[0] * p.shape[1] for p in decoder_layer(arch, lora) if len(p.shape) == 2)
    return BF16 * weights * (1 if checkpointing else arch.layers)


def logits_chunk_bytes(arch: Architecture, tokens: int, mixed_precision: bool) -> int:
    """min(1024, T) x V x (4 + 4 + 2), + V x H x 2 without mixed precision."""
    lm_head_copy = 0 if mixed_precision else arch.vocab * arch.hidden * BF16
    return min(LOGIT_CHUNK_TOKENS, tokens) * arch.vocab * (FP32 + FP32 + BF16) + lm_head_copy


def kv_bytes_per_token(arch: Architecture) -> int:
    """2 (K and V) x L x kv_heads x head_dim x 2 (bf16)."""
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * BF16


def concurrent_streams(cfg: TrainConfig) -> int:
    """Sequences the run samples at once: its env streams (ppo), or its group episodes (an env's at most n_env)."""
    if cfg.algorithm_spec.batches is Batches.STREAMS:
        return cfg.rollout.n_env
    episodes = cfg.group.n_tasks * cfg.group.group_size
    return episodes if cfg.task is not None else min(cfg.rollout.n_env, episodes)


def decode_rows(cfg: TrainConfig, gpus: int) -> int:
    """Sequences one GPU's engine decodes at once: its share of the streams, at most rollout.max_batch_size."""
    return min(-(-concurrent_streams(cfg) // gpus), cfg.rollout.max_batch_size)


def model_context(cfg: TrainConfig, arch: Architecture) -> int:
    if cfg.rollout.engine_spec.reserves_gpu_memory and cfg.rollout.vllm.max_model_len:
        return min(arch.context, cfg.rollout.vllm.max_model_len)
    return arch.context


def sequence_length(cfg: TrainConfig, arch: Architecture) -> tuple[int, str]:
    """(S, how it was estimated): tokens of one training row and of one engine sequence (module docstring)."""
    context = model_context(cfg, arch)
    if cfg.task is not None:
        tokens, rule = PROMPT_TOKENS + cfg.task.max_total_tokens, f"{PROMPT_TOKENS} prompt + task.max_total_tokens"
    elif cfg.agent.history == "full":
        if cfg.merge.max_prompt_len and cfg.merge.max_response_len:
            tokens = cfg.merge.max_prompt_len + cfg.merge.max_response_len
            rule = "merge.max_prompt_len + max_response_len"
        else:
            tokens, rule = context, "agent.history=full: a row may hold a whole episode"
    else:
        memory, response = cfg.agent.memory, cfg.rollout.max_tokens
        tokens = PROMPT_TOKENS + memory * (PROMPT_TOKENS + response) + response
        rule = f"{PROMPT_TOKENS} prompt + {memory} remembered x ({PROMPT_TOKENS} + {response}) + {response} response"
    if tokens > context:
        tokens, rule = context, f"{rule}, capped at the model's context"
    return tokens, rule


def micro_batch_tokens(cfg: TrainConfig, seq_len: int) -> int:
    """T: optim.max_tokens_per_micro_batch (a longer row is a micro-batch alone; auto is resolved by
    `with_auto_budget` first), else micro_batch_size x S."""
    budget = cfg.optim.max_tokens_per_micro_batch
    if budget == "auto":
        raise ValueError("optim.max_tokens_per_micro_batch=auto: resolve it with with_auto_budget first")
    return max(budget, seq_len) if budget else cfg.optim.micro_batch_size * seq_len


def largest_budget(fits: Callable[[int], bool], seq_len: int, high: int) -> int | None:
    """The largest token budget in [S, high] for which `fits` holds (memory grows with the budget), rounded
    down to a multiple of 256 but not below S (one row); None when not even one row fits."""
    low = seq_len
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return max(seq_len, low // 256 * 256)


def peak_bytes(arch: Architecture, cfg: TrainConfig, gpus: int, gpu_bytes: int, seq_len: int) -> int:
    """The larger of steady state and start-up, bytes per GPU."""
    components = memory_components(arch, cfg, gpus, gpu_bytes, seq_len)
    return max(sum(components.values()), startup_bytes(arch, cfg, components)[0])


def with_auto_budget(arch: Architecture, cfg: TrainConfig, gpus: int, gpu_bytes: int, seq_len: int) -> TrainConfig:
    """`cfg` with optim.max_tokens_per_micro_batch=auto resolved: the largest budget whose plan fits the GPU less
    CUDA_RESERVE, at most a rank's share of a mini-batch (ceil(mini_batch_size / gpus) rows of S tokens); one
    row when none fits (the plan then says what would). Any other setting: `cfg` itself."""
    if cfg.optim.max_tokens_per_micro_batch != "auto":
        return cfg
    rows = -(-cfg.optim.mini_batch_size // gpus)
    budget = largest_budget(
        lambda tokens: peak_bytes(arch, _with(cfg, "optim", max_tokens_per_micro_batch=tokens), gpus, gpu_bytes,
                                  seq_len) <= gpu_bytes - CUDA_RESERVE,
        seq_len, max(rows * seq_len, seq_len))
    return _with(cfg, "optim", max_tokens_per_micro_batch=budget or seq_len)


def memory_components(arch: Architecture, cfg: TrainConfig, gpus: int, gpu_bytes: int, seq_len: int) -> dict[str, int]:
    """Bytes per GPU of each component (COMPONENTS), as the module docstring counts them."""
    world = gpus if cfg.dist.shard else 1
    mixed_precision, checkpointing = cfg.bf16_parameters("cuda"), cfg.dist.activation_checkpointing
    compute = BF16 if mixed_precision else FP32
    lora = cfg.model.lora
    actor = policy_network(arch, lora)
    critic = critic_network(arch, lora) if cfg.algorithm_spec.critic else None
    reference = None if lora else policy_network(arch, None).frozen()

    def state(network):
        return (0, 0, 0) if network is None or cfg.dist.cpu_offload else sharded_state(network, world, compute)

    tokens = micro_batch_tokens(cfg, seq_len)
    rollout = cfg.rollout
    in_trainer_engine = rollout.engine_spec.samples_learner_module
    rows = decode_rows(cfg, gpus)
    utilization = rollout.vllm.gpu_memory_utilization or VLLM_GPU_MEMORY_UTILIZATION
    engine_copies = 2 if rollout.async_training.in_a_process else 1    # + the staging copy a producer process reads
    return dict(zip(COMPONENTS, [
        *state(actor), *state(critic), state(reference)[0],
        max(gathered_bytes(n, world, compute) for n in (actor, critic, reference) if n),
        max(reduce_bytes(n, world, compute) for n in (actor, critic) if n),
        activation_bytes(arch, lora, tokens, seq_len, checkpointing, mixed_precision),
        autocast_weight_bytes(arch, lora, checkpointing, mixed_precision),
        logits_chunk_bytes(arch, tokens, mixed_precision),
        engine_copies * parameter_count(policy_network(arch, None)) * BF16 if in_trainer_engine else 0,
        (rows * seq_len + rollout.prefix_cache_tokens) * kv_bytes_per_token(arch) if in_trainer_engine else 0,
        int(utilization * gpu_bytes) if rollout.engine_spec.reserves_gpu_memory else 0,
    ]))


def startup_bytes(arch: Architecture, cfg: TrainConfig, components: dict[str, int]) -> tuple[int, int]:
    """(bytes per GPU at start-up, bytes of rank 0's CPU memory at start-up): the stored parameters, the
    engine's weights (and vLLM's reservation; the hf engine's KV comes later, with the first prompts) and
    two fp32 copies of the largest whole parameter (a gather's buffer and its result); the initial fp32 policy (and a
    LoRA critic's copy) on rank 0's host."""
    stored = sum(components[key] for key in ("actor_params", "critic_params", "reference_params",
                                             "engine_weights", "vllm_reservation"))
    network = policy_network(arch, None)
    largest = max(prod(p.shape) for p in network.root + network.layer)
    policy = parameter_count(network) * FP32
    copies = 2 if cfg.model.lora is not None and cfg.algorithm_spec.critic else 1
    return stored + 2 * largest * FP32, copies * policy


@dataclass
class Suggestion:
    changes: list[str]      # overrides ("dist.cpu_offload=true") and "--gpus N"
    total: int              # bytes per GPU with them
    combination: bool       # no single change was enough


@dataclass
class Plan:
    recipe: str
    model: str
    model_source: str
    parameters: int
    gpus: int
    shard_world: int
    gpu_bytes: int
    seq_len: int
    seq_rule: str
    tokens: int
    streams_per_gpu: int
    settings: dict
    components: dict[str, int]
    total: int
    startup: int            # bytes per GPU at start-up
    startup_host: int       # bytes of rank 0's CPU memory at start-up
    fits: bool
    suggestion: Suggestion | None


def _with(cfg: TrainConfig, section: str, **values) -> TrainConfig:
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})


def suggest(arch: Architecture, cfg: TrainConfig, gpus: int, gpu_bytes: int, seq_len: int) -> Suggestion | None:
    """The first of CHANGES that alone makes the run fit, else the cheapest combination (the one whose
    most expensive change comes earliest in CHANGES, then the fewest changes); None when nothing fits.
    A smaller token budget is the largest (a multiple of 256, at least one row) that fits; more GPUs the
    fewest that fit."""
    def total(c: TrainConfig, g: int) -> int:
        return peak_bytes(arch, c, g, gpu_bytes, seq_len)

    tokens = micro_batch_tokens(cfg, seq_len)
    fixed = {  # change -> (section, key, value, the override that sets it)
        "activation_checkpointing": ("dist", "activation_checkpointing", True, "dist.activation_checkpointing=true"),
        "lora": ("model", "lora", LoRAConfig(), "model.lora={r: 16}"),
        "cpu_offload": ("dist", "cpu_offload", True, "dist.cpu_offload=true"),
    }

    def attempt(names: tuple[str, ...]) -> Suggestion | None:
        c, g, changes = cfg, gpus, []
        for name in names:
            if name in fixed:
                section, key, value, override = fixed[name]
                if getattr(getattr(c, section), key):
                    return None          # already on
                c = _with(c, section, **{key: value})
                changes.append(override)
        if "token_budget" in names and tokens <= seq_len:
            return None                  # one row per micro-batch already
        if "gpus" in names:
            if total(c, MAX_GPUS) > gpu_bytes:
                return None
            smallest = _with(c, "optim", max_tokens_per_micro_batch=seq_len) if "token_budget" in names else c
            g = next((n for n in range(gpus + 1, MAX_GPUS + 1) if total(smallest, n) <= gpu_bytes), None)
            if g is None:
                return None
        if "token_budget" in names:
            budget = largest_budget(lambda t: total(_with(c, "optim", max_tokens_per_micro_batch=t), g) <= gpu_bytes,
                                    seq_len, tokens - 1)
            if budget is None:
                return None
            c = _with(c, "optim", max_tokens_per_micro_batch=budget)
            changes.append(f"optim.max_tokens_per_micro_batch={budget}")
        if "gpus" in names:
            changes.append(f"--gpus {g}")
        used = total(c, g)
        return Suggestion(changes, used, len(names) > 1) if used <= gpu_bytes else None

    combos = sorted((names for k in range(2, len(CHANGES) + 1) for names in combinations(CHANGES, k)),
                    key=lambda names: (max(map(CHANGES.index, names)), len(names)))
    for names in [(name,) for name in CHANGES] + combos:
        if suggestion := attempt(names):
            return suggestion
    return None


def plan_for(arch: Architecture, cfg: TrainConfig, gpus: int, gpu_bytes: int, seq_len: int | None = None,
             recipe: str = "", model: str = "", model_source: str = "") -> Plan:
    """The plan of `cfg` on `gpus` GPUs of `gpu_bytes` each; S estimated unless `seq_len` is given."""
    if gpus < 1:
        raise ValueError(f"--gpus {gpus}: at least 1")
    seq_len, seq_rule = (seq_len, "--seq-len") if seq_len else sequence_length(cfg, arch)
    cfg = with_auto_budget(arch, cfg, gpus, gpu_bytes, seq_len)
    components = memory_components(arch, cfg, gpus, gpu_bytes, seq_len)
    total = sum(components.values())
    startup, startup_host = startup_bytes(arch, cfg, components)
    fits = max(total, startup) <= gpu_bytes
    settings = {"algorithm": cfg.algorithm, "lora": cfg.model.lora.r if cfg.model.lora else None,
                "engine": cfg.rollout.engine, **{key: getattr(cfg.dist, key) for key in DIST_FLAGS},
                "mixed_precision": cfg.bf16_parameters("cuda")}
    return Plan(recipe=recipe, model=model, model_source=model_source,
                parameters=parameter_count(policy_network(arch, None)), gpus=gpus,
                shard_world=gpus if cfg.dist.shard else 1, gpu_bytes=gpu_bytes, seq_len=seq_len, seq_rule=seq_rule,
                tokens=micro_batch_tokens(cfg, seq_len),
                streams_per_gpu=decode_rows(cfg, gpus),
                settings=settings, components=components, total=total, startup=startup,
                startup_host=startup_host, fits=fits,
                suggestion=None if fits else suggest(arch, cfg, gpus, gpu_bytes, seq_len))


def plan(cfg: TrainConfig, gpus: int, gpu_memory_gib: float = 80.0, seq_len: int | None = None,
         recipe: str = "") -> Plan:
    """`plan_for` the model `cfg.model.path` names, read from its config.json (`load_model_config`)."""
    config, source = load_model_config(cfg)
    return plan_for(Architecture.from_config(config), cfg, gpus, int(gpu_memory_gib * GIB), seq_len, recipe,
                    cfg.model.path or "model.tiny", source)


def auto_token_budget(cfg: TrainConfig, gpus: int, gpu_bytes: int) -> int:
    """optim.max_tokens_per_micro_batch=auto for a run of `cfg` on `gpus` GPUs of `gpu_bytes` (`with_auto_budget`),
    S estimated from the config."""
    config, _ = load_model_config(cfg)
    arch = Architecture.from_config(config)
    seq_len, _ = sequence_length(cfg, arch)
    return with_auto_budget(arch, cfg, gpus, gpu_bytes, seq_len).optim.max_tokens_per_micro_batch


def tiny_config(tiny: TinyModel) -> dict:
    """config.json of the tiny Llama model built when model.path is null (learner.models.build_tiny_policy)."""
    return {"model_type": "llama", "vocab_size": tiny.vocab_size, "hidden_size": tiny.hidden_size,
            "intermediate_size": tiny.intermediate_size, "num_hidden_layers": tiny.num_layers,
            "num_attention_heads": tiny.num_heads, "num_key_value_heads": tiny.num_kv_heads,
            "max_position_embeddings": tiny.max_position_embeddings, "tie_word_embeddings": True}


def load_model_config(cfg: TrainConfig) -> tuple[dict, str]:
    """(config.json as a dict, where it was read): `model.tiny` for model.path null; a local or
    `builtin:` folder's config.json; for a hub id the Hugging Face cache, then the hub, then the copy
    shipped in horizonrl/model_configs (the recipes' models; logged)."""
    from horizonrl.learner.models import is_local_path, resolve_model_path

    name = cfg.model.path
    if name is None:
        return tiny_config(cfg.model.tiny), "model.tiny"
    path = resolve_model_path(name)
    if is_local_path(path):
        file = Path(path).expanduser() / "config.json"
        if not file.is_file():
            raise ConfigError(f"model.path: {file} not found")
        return json.loads(file.read_text()), str(file)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name, local_files_only=True).to_dict(), "its config.json in the HF cache"
    except OSError:
        pass
    error = "the hub is not reachable"
    if _hub_resolves():
        try:
            return AutoConfig.from_pretrained(name).to_dict(), "its config.json from the HF hub"
        except OSError as failure:
            error = str(failure).splitlines()[0]
    shipped = SHIPPED_CONFIGS / f"{name.replace('/', '--')}.json"
    if shipped.is_file():
        log.info("model.path %s: %s; using the copy of its config.json shipped in horizonrl/model_configs", name, error)
        return json.loads(shipped.read_text()), f"shipped copy of its config.json: {error}"
    raise ConfigError(f"model.path: cannot read {name}'s config.json: {error}")


def _hub_resolves() -> bool:
    """Whether the hub's host name resolves (offline, transformers would retry for ~25 s first)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        socket.getaddrinfo(urlparse(constants.ENDPOINT).hostname, 443)
    except OSError:
        return False
    return True


def format_plan(plan: Plan) -> str:
    """A readable report: the run's shape, one row per component in GiB, the total, and the verdict."""
    s = plan.settings
    tuning = "full fine-tune" if s["lora"] is None else f"LoRA r={s['lora']}"
    models = "actor + critic + reference" if algorithm(s["algorithm"]).critic else "actor + reference"
    flags = " ".join(f"{key}={str(s[key]).lower()}" for key in DIST_FLAGS)
    lines = [
        f"memory plan{' for ' + plan.recipe if plan.recipe else ''}: {plan.gpus} GPU(s) x "
        f"{plan.gpu_bytes / GIB:.2f} GiB, one rank per GPU, parameters sharded over {plan.shard_world} rank(s)",
        f"model: {plan.model} ({plan.model_source}), {plan.parameters:,} parameters",
        f"training: {s['algorithm']} ({models}), {tuning}; dist: {flags}",
        f"micro-batch: {plan.tokens:,} tokens; rows of {plan.seq_len:,} tokens ({plan.seq_rule})",
        f"engine: {s['engine']}, {plan.streams_per_gpu} sequences per GPU",
        "",
        f"{'component':<30}{'GiB/GPU':>10}",
    ]
    lines += [f"{label:<30}{plan.components[key] / GIB:>10.2f}" for key, label in COMPONENTS.items()]
    lines += ["-" * 40, f"{'total':<30}{plan.total / GIB:>10.2f}", f"{'start-up peak':<30}{plan.startup / GIB:>10.2f}",
              f"{'GPU memory':<30}{plan.gpu_bytes / GIB:>10.2f}", f"{'fits':<30}{'yes' if plan.fits else 'no':>10}",
              f"start-up: rank 0 also holds {plan.startup_host / GIB:.2f} GiB of CPU memory (the initial policy)"]
    if not plan.fits:
        suggestion = plan.suggestion
        if suggestion is None:
            lines.append("no change among " + ", ".join(CHANGES) + " (nor all of them) makes it fit")
        else:
            kind = "cheapest combination (no single change fits)" if suggestion.combination else "smallest change"
            lines.append(f"{kind}: {' '.join(suggestion.changes)} -> {suggestion.total / GIB:.2f} GiB per GPU")
    return "\n".join(lines)
