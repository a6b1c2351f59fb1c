"""The three networks of PPO: the policy (actor), the critic (backbone + scalar value head) and the
frozen reference policy; plus loading a policy from a path or hub id, or building a tiny one."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from horizonrl.config import ConfigError
from horizonrl.engines.hf import copy_weights
from horizonrl.learner.gguf import PACKAGED_GGUF, gguf_folder, packaged_gguf
from horizonrl.learner.lora import merged_parameters
from horizonrl.learner.shared_prefix import Plan, Sharing, body_hidden


BUILTIN = "builtin:"
BUILTIN_CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
LOCAL_PREFIXES = ("/", "./", "../", "~", "runs/")


def resolve_model_path(name_or_path: str) -> str:
    """`builtin:<name>` is a checkpoint shipped inside the package (horizonrl/checkpoints/<name>) or a
    GGUF file shipped by a pip package (learner/gguf.PACKAGED_GGUF); a path ending in .gguf is a GGUF
    file. Both GGUF kinds resolve to their cached converted folder (converted on first use). Anything
    else is a local folder or a hub id, returned as is."""
    if name_or_path.lower().endswith(".gguf"):
        return str(gguf_folder(Path(name_or_path).expanduser()))
    if not name_or_path.startswith(BUILTIN):
        return name_or_path
    name = name_or_path.removeprefix(BUILTIN)
    if name in PACKAGED_GGUF:
        return str(gguf_folder(packaged_gguf(name)))
    folder = BUILTIN_CHECKPOINTS / name
    if not (folder / "config.json").is_file():
        shipped = sorted([BUILTIN + p.parent.name for p in BUILTIN_CHECKPOINTS.glob("*/config.json")]
                         + [BUILTIN + n for n in PACKAGED_GGUF])
        raise ConfigError(f"model.path: no built-in checkpoint {name_or_path!r}; shipped: {', '.join(shipped)}")
    return str(folder)


def is_local_path(name_or_path: str) -> bool:
    """Whether `name_or_path` names a local folder rather than a hub id ("name" or "org/name"): it
    exists, starts with /, ./, ../, ~ or runs/, has more than one "/", or its parent folder exists."""
    path = Path(name_or_path).expanduser()
    return (path.exists() or name_or_path.startswith(LOCAL_PREFIXES) or name_or_path.count("/") > 1
            or (path.parent != Path(".") and path.parent.is_dir()))


def load_policy(name_or_path: str, device: torch.device):
    """Tokenizer and causal LM from a Hugging Face hub id, a local folder or a `builtin:` checkpoint
    (weights kept in fp32: mixed precision happens in autocast, the optimizer holds full-precision
    master weights). A local path (`is_local_path`) that is no model folder says so, rather than
    being tried as a hub id."""
    name_or_path = resolve_model_path(name_or_path)
    if is_local_path(name_or_path):
        folder = Path(name_or_path).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"model.path: no such folder: {folder} "
                              "(a hub id looks like Qwen/Qwen2.5-0.5B-Instruct)")
        if not (folder / "config.json").is_file():
            raise ConfigError(f"model.path: {folder} is not a model folder (no config.json)")
        name_or_path = str(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch.float32).to(device)
    except (OSError, ValueError) as error:  # not on the hub, no network, files that do not load
        raise ConfigError(f"model.path: cannot load {name_or_path!r}: {error}") from None
    check_compatible(tokenizer, model, name_or_path)
    return tokenizer, model


def build_tiny_policy(tokenizer, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                      intermediate_size: int, max_position_embeddings: int, seed: int) -> nn.Module:
    """A randomly initialised Llama-architecture causal LM sized for `tokenizer`.

    Llama rather than Qwen2: for `qwen2` checkpoints, transformers' AutoTokenizer swaps in Qwen's own
    pre-tokenizer, so a custom tokenizer saved beside the model would not load back as trained.
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


def check_compatible(tokenizer, model, name: str) -> None:
    """A tokenizer whose ids the model cannot embed, or that has no chat template, is an error here
    rather than an index error deep inside a forward pass."""
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise ConfigError(f"model.path: {name}: tokenizer has {len(tokenizer)} tokens but the model embeds only "
                          f"{vocab}")
    if not tokenizer.chat_template:
        raise ConfigError(f"model.path: {name}: tokenizer has no chat template; horizonrl builds prompts with "
                          "apply_chat_template")
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"model.path: {name}: tokenizer has no EOS token to end a response")


def pad_token_id(tokenizer) -> int:
    """The id that pads rows: the tokenizer's pad token, or its EOS when it has none (masked out either way)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def stop_ids(tokenizer, model) -> tuple[int, ...]:
    """Ids that end a response: the tokenizer's EOS and the model's generation-config EOS ids."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    return tuple(sorted(i for i in ids if i is not None))


def frozen_copy(model: nn.Module) -> nn.Module:
    """The reference policy: a copy of the initial actor with gradients off."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def engine_copy(actor: nn.Module, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The whole policy an hf engine samples from when it cannot share the actor (a LoRA or a sharded run),
    in `dtype` on `device`, refreshed after every update (train/phases.sync_engine). Allocated empty, then
    filled one whole tensor at a time from `actor` (plain, PEFT-wrapped or FSDP2-sharded: under torchrun
    every rank calls, in the same order), adapters merged (learner/lora.merged_parameters)."""
    base = actor.get_base_model() if hasattr(actor, "get_base_model") else actor
    with torch.device("meta"):
        engine = AutoModelForCausalLM.from_config(base.config, dtype=dtype)
    engine.generation_config = base.generation_config
    engine.to_empty(device=device)
    engine.tie_weights()                  # to_empty gives each name a tensor of its own
    copy_weights(engine, actor, merged_parameters(actor))
    buffers = dict(base.named_buffers())
    with torch.no_grad():
        for name, buffer in engine.named_buffers():
            buffer.copy_(buffers[name])
    return engine.eval().requires_grad_(False)


class ValueModel(nn.Module):
    """Critic: the policy's transformer backbone with a scalar head.

    forward(...)[b, t] is the value of the state that ends with token t, i.e. of prefix ids[:t+1].
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> ValueModel:
        """A critic initialised from a copy of the policy's backbone; the head starts at V = 0."""
        return cls(copy.deepcopy(policy.base_model), policy.config.hidden_size).to(policy.device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sharing: Sharing | None = None,
                micro_batch: Plan | None = None) -> torch.Tensor:
        """The values [B, T]; with `sharing`, the backbone shares the rows' prefixes as the micro-batch's Plan says
        (learner/shared_prefix.body_hidden)."""
        hidden = body_hidden(self.backbone, input_ids, attention_mask, sharing, micro_batch)
        return self.value_head(hidden).sum(-1).float()   # [B, T, 1] -> [B, T], a new tensor (not a view)
