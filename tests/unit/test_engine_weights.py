"""The folder `write_untied` writes for an inference server: it names the transformers class of the model under
its wrappers (PEFT's, FSDP2's), the architecture `vllm serve` looks up, never the wrapper's class; its weights
load back bit-equal (tied names included) from shards written as the tensors arrive, so that the host holds
about one shard, never the whole model (measured); a rewrite replaces them whole, and a failed one leaves the
previous weights."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import transformers
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from unit.test_lora import LORA, tiny_llama

from horizonrl.engines import weights
from horizonrl.engines.weights import write_untied
from horizonrl.learner.lora import add_lora

NO_TOKENIZER = SimpleNamespace(save_pretrained=lambda folder: None)


def architectures(folder) -> list[str]:
    return json.loads((folder / "config.json").read_text())["architectures"]


def test_a_peft_wrapped_model_is_recorded_as_its_base_class(tmp_path):
    model = add_lora(tiny_llama(), LORA)
    assert type(model).__name__ == "PeftModelForCausalLM"
    write_untied(model, NO_TOKENIZER, tmp_path, tensors=model.get_base_model().state_dict().items())
    assert architectures(tmp_path) == ["LlamaForCausalLM"]


@pytest.fixture()
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def test_an_fsdp2_sharded_model_is_recorded_as_its_own_class(tmp_path, one_rank_group):
    model = fully_shard(tiny_llama(), mesh=one_rank_group)
    assert type(model).__name__ == "FSDPLlamaForCausalLM"
    folder = tmp_path / "engine"
    write_untied(model, NO_TOKENIZER, folder, tensors=((n, t.full_tensor()) for n, t in model.state_dict().items()))
    (name,) = architectures(folder)
    assert name == "LlamaForCausalLM" and getattr(transformers, name) is transformers.LlamaForCausalLM


def test_a_module_without_a_transformers_model_is_refused_by_name(tmp_path):
    module = torch.nn.Linear(2, 2)
    module.config = tiny_llama().config
    with pytest.raises(TypeError, match="Linear: no transformers model"):
        write_untied(module, NO_TOKENIZER, tmp_path)


MiB = 1 << 20


def written(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor the folder's index names, read from the shards it names (which must be all the folder's
    weight files)."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert {p.name for p in folder.glob("*.safetensors")} == shards
    tensors = {name: tensor for shard in shards for name, tensor in load_file(folder / shard).items()}
    assert set(tensors) == set(index["weight_map"])
    return tensors


def test_the_weights_load_back_bit_equal_tied_names_included(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "SHARD_BYTES", 16 * 1024)       # several shards
    model = tiny_llama()
    state = model.state_dict()
    write_untied(model, NO_TOKENIZER, tmp_path)
    assert len(set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())) > 3
    saved = written(tmp_path)
    assert set(saved) == set(state) and "lm_head.weight" in saved
    assert all(torch.equal(saved[name], tensor) and saved[name].dtype == tensor.dtype for name, tensor in state.items())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)       # as a user would, untied
    assert not loaded.config.tie_word_embeddings
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in state.items())


def test_the_weights_are_written_in_the_dtype_asked(tmp_path):
    model = tiny_llama()
    write_untied(model, NO_TOKENIZER, tmp_path, torch.bfloat16)
    saved = written(tmp_path)
    assert all(saved[name].dtype == torch.bfloat16 and torch.equal(saved[name], tensor.to(torch.bfloat16))
               for name, tensor in model.state_dict().items())


def gathered(count: int, numel: int, fail_at: int | None = None):
    """`count` fresh (name, tensor) pairs of `numel` float32s, the i-th full of i, made one at a time as
    merged_parameters gathers them under FSDP2 (so the writer holds what it keeps, never the caller)."""
    for i in range(count):
        if i == fail_at:
            raise RuntimeError("the gather failed")
        yield f"layers.{i}.weight", torch.full((numel,), float(i))


def peak_rss_growth(write) -> int:
    """Bytes the resident set grew to at its peak while `write()` ran (Linux: VmHWM, reset first through
    /proc/self/clear_refs; torch's storage is invisible to tracemalloc)."""
    def status(field: str) -> int:
        line = next(entry for entry in Path("/proc/self/status").read_text().splitlines() if entry.startswith(field))
        return int(line.split()[1]) * 1024

    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as error:
        pytest.skip(f"no peak-RSS reset here: {error}")
    before = status("VmRSS:")
    write()
    return status("VmHWM:") - before


def test_the_host_holds_about_one_shard_never_the_model(tmp_path, monkeypatch):
    """200 MiB of weights arriving one 4 MiB tensor at a time through 16 MiB shards: the peak resident
    growth stays near one shard (today's whole-state-dict writer: above 200 MiB)."""
    monkeypatch.setattr(weights, "SHARD_BYTES", 16 * MiB)
    numel = 4 * MiB // 4
    growth = peak_rss_growth(lambda: write_untied(tiny_llama(), NO_TOKENIZER, tmp_path, tensors=gathered(50, numel)))
    print(f"peak RSS growth writing 200 MiB in 16 MiB shards: {growth / MiB:.1f} MiB")
    assert growth < 48 * MiB
    saved = written(tmp_path)
    assert len(saved) == 50 and all(torch.equal(saved[f"layers.{i}.weight"], torch.full((numel,), float(i)))
                                    for i in range(50))


def test_a_rewrite_replaces_the_weights_whole(tmp_path, monkeypatch):
    """The second write's shards replace the first's (and a single-file model.safetensors from an older
    write): only the new weights remain, and every loader reads them."""
    monkeypatch.setattr(weights, "SHARD_BYTES", 64 * 1024)
    model = tiny_llama()
    write_untied(model, NO_TOKENIZER, tmp_path, tensors=gathered(8, 4096))
    (tmp_path / "model.safetensors").write_bytes(b"stale")
    write_untied(model, NO_TOKENIZER, tmp_path)
    saved = written(tmp_path)
    assert set(saved) == set(model.state_dict())
    assert all(torch.equal(saved[name], tensor) for name, tensor in model.state_dict().items())


def test_a_write_that_fails_midway_leaves_the_previous_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "SHARD_BYTES", 16 * 1024)
    write_untied(tiny_llama(), NO_TOKENIZER, tmp_path, tensors=gathered(6, 1024))
    with pytest.raises(RuntimeError, match="the gather failed"):
        write_untied(tiny_llama(), NO_TOKENIZER, tmp_path, tensors=((name, -tensor) for name, tensor in
                                                                     gathered(6, 1024, fail_at=5)))
    saved = written(tmp_path)          # no shard of the failed write is left behind
    assert all(torch.equal(saved[f"layers.{i}.weight"], torch.full((1024,), float(i))) for i in range(6))


def test_a_name_given_twice_is_refused(tmp_path):
    twice = [("a", torch.zeros(2)), ("a", torch.ones(2))]
    with pytest.raises(ValueError, match="'a' is given twice"):
        write_untied(tiny_llama(), NO_TOKENIZER, tmp_path, tensors=twice)
