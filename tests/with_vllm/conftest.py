import os

import pytest
import torch

# This suite runs beside the main suite's two workers (.ci/run). vLLM's CPU engine would bind an OpenMP thread
# to each core and spin there, taking the cores from those workers; one unbound thread per engine shares them.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def tiny():
    """A tiny model for the river env with head size 32 (vLLM's CPU attention has no kernel for the
    default 16) and tied embeddings (the case vLLM's in-place reload gets wrong); one per module, as a
    sync test changes its weights."""
    from horizonrl import envs
    from horizonrl.config import TinyModel
    from horizonrl.assembly.warm_start import build_tiny_for_envs

    tokenizer, model = build_tiny_for_envs([envs.make("river")], TinyModel(hidden_size=128, intermediate_size=384),
                                           seed=0, device=torch.device("cpu"))
    assert model.config.tie_word_embeddings
    return tokenizer, model.eval()
