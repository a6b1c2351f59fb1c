"""The same code on a CUDA GPU (bf16 autocast over fp32 weights). Skipped where there is no GPU."""

import copy
import math

import pytest
import torch
from engine_streams import assert_same_samples, prompts_of, turns_of_streams

from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.device import autocast_dtype, resolve_device
from horizonrl.learner.scoring import token_logprobs
from horizonrl.report.metrics import read_metrics
from horizonrl.samples.tensors import pad

TOY = str(SOURCE_CONFIGS / "toy.yaml")   # the river recipe: small, fast runs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_auto_device_is_cuda_with_bf16_autocast():
    device = resolve_device("auto")
    assert device.type == "cuda" and autocast_dtype(device) == torch.bfloat16


def test_the_graph_decode_step_samples_what_the_dynamic_step_samples(river_tiny):
    """engines/decode_graph.py on a GPU: CUDA graphs of the fixed-shape decode step, recorded once per buffer set
    and replayed (the default on CUDA), sample what the dynamic step samples (fp32)."""
    tokenizer, cpu_model = river_tiny
    model = copy.deepcopy(cpu_model).cuda()
    prompts = prompts_of(tokenizer, 6)
    dynamic = turns_of_streams(HFEngine(model, tokenizer.pad_token_id, seed=3, decode_step="dynamic"), prompts)
    engine = HFEngine(model, tokenizer.pad_token_id, seed=3)
    graphed = turns_of_streams(engine, prompts)
    assert engine.decode_step == "graph" and engine._static_decode.recordings > 0   # no recording failed
    assert_same_samples(graphed, dynamic, tolerance=1e-5)


def test_engine_and_learner_logprobs_agree_on_gpu(river_tiny):
    import asyncio

    tokenizer, cpu_model = river_tiny
    model = copy.deepcopy(cpu_model).cuda()
    engine = HFEngine(model, tokenizer.pad_token_id, seed=0, autocast_dtype=torch.bfloat16)
    prompts = [tokenizer.encode(f"You are on stone {i} of 5.\nThe next stone is to your left.") for i in range(4)]

    async def run():
        return await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=8)) for p in prompts))

    generations = asyncio.run(run())
    rows = [p + g.token_ids for p, g in zip(prompts, generations)]
    input_ids = pad(rows, tokenizer.pad_token_id, torch.long, model.device)
    attention = pad([[1] * len(r) for r in rows], 0, torch.long, model.device)
    mask = pad([[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, generations)], 0, torch.float32,
               model.device)
    with torch.no_grad():
        logp, _ = token_logprobs(model, input_ids, attention, mask)
    for row, (p, g) in enumerate(zip(prompts, generations)):
        learner = logp[row, len(p):len(p) + len(g.token_ids)].float().cpu()
        # bf16 with different batch shapes: agreement to bf16 precision, not bit-exact
        assert torch.allclose(learner, torch.tensor(g.logprobs), atol=0.1), (learner, g.logprobs)


def test_train_runs_on_gpu(tmp_path):
    assert main(["train", TOY, "iterations=2", "device=cuda", "rollout.n_env=4", "ppo.e_len=4",
                 "optim.mini_batch_size=8", "optim.micro_batch_size=8", "critic.warmup_batches=1",
                 "model.warm_start.steps=20", f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert records[-1]["iteration"] == 2 and math.isfinite(records[-1]["train/actor/pg_loss"])
