"""The one-command GPU check: what a developer runs when a GPU is lent; prints one JSON object.

    python benchmarks/gpu_check.py            # CUDA: Qwen2.5-1.5B shape; meant to take under 10 minutes on one H100
    python benchmarks/gpu_check.py --smoke    # CPU: the same code path on a tiny Qwen2 model (CI; also without a GPU)

Five pieces (no vLLM on the lent machines: rollout.engine=hf throughout):
1. the CUDA test file (tests/integration/test_cuda.py) in a pytest subprocess;
2. the learner's log-probs (learner/scoring.token_logprobs) of the same rows in fp32 and under bf16
   autocast (`precision("bf16")`), on a random Qwen2.5-1.5B-shaped model with the real Qwen2.5 tokenizer
   (tests/qwen25_tokenizer.py, offline);
3. two iterations of the real trainer on that model, as `horizonrl train configs/toy.yaml` under
   `torchrun --nproc_per_node 1` runs them (the launch `horizonrl plan --gpus 1` models: FSDP2 on one
   rank; hf engine, river env, PPO with actor, critic and reference): `assembly.context.start_run`, then
   `train.ppo.ppo_iteration`, once as a full fine-tune and once with `model.lora={r: 16}`, each in its
   own process. Its peak memory is set against `horizonrl.plan.plan(cfg, gpus=1)` with the plan's row
   length S set to the longest row the run trained on (the planner's own estimate of S is for long
   multi-turn prompts);
4. the update's model FLOPs utilisation;
5. the hf engine's decode rate, dynamic and replayed as CUDA graphs (engines/decode_graph.py), against one batched
   `generate` and the memory-bandwidth bound (`decode_speed`).
Three variants of the trainer (VARIANTS): "full" and "lora" at the defaults, and "before": the settings these
defaults replaced (fp32 FSDP parameters under bf16 autocast, micro-batches of rows), compared in
"defaults_vs_before". On a CPU (--smoke) "before" is left out: there the defaults resolve to its settings.

JSON keys:
  device              torch.cuda.get_device_name(), or "cpu"
  smoke               true: tiny model on the CPU (checks the code path, not the numbers)
  model               {"parameters", "hidden_size", "num_hidden_layers", "vocab_size"} of the checked model
  seconds             wall time of the whole check
  cuda_tests          {"passed", "failed", "errors", "skipped", "seconds"} of the pytest run (+ "output", its
                      tail, when it failed); null on the CPU or with --skip-tests
  bf16_vs_fp32        {"mean_abs_diff", "max_abs_diff", "tokens", "fp32_logp_mean"}: |logp_bf16 - logp_fp32| over
                      the scored tokens (random weights: logits are flatter than a trained model's)
  config              {"recipe": "configs/toy.yaml", "overrides": [key=value given to both variants], "lora": the
                      LoRA variant's one more}
  decode              decode_speed's {"streams", "new_tokens", "engine_tokens_per_s": {"dynamic", "graph" (CPU:
                      "static")}, "fixed_shape_step", "generate_tokens_per_s", "bandwidth_tokens_per_s"}
  variants            {"before": {...}, "full": {...}, "lora": {...}} ("full" and "lora" with --smoke), each (or
                      {"error", "output", "seconds"} when its process failed):
      micro_batch         the run's micro-batch budget: {"tokens": N} (optim.max_tokens_per_micro_batch, auto
                          resolved) or {"rows": N}
      startup_s           start_run's seconds (load, shard, engine copy, optimizers)
      iteration_s         each iteration's seconds (rollout + scoring + update + weight sync)
      update_s            the last iteration's update seconds (learner.update.minibatch_updates, critic and actor)
      trained_tokens      attended tokens x epochs x networks updated (2: critic and actor) in that update
      rows, seq_len       rows of that batch and the longest one's tokens (the S given to the plan)
      startup_peak_gib    peak device memory during start_run: torch.cuda.max_memory_allocated(); on the CPU the
                          growth of peak RSS (VmHWM) over the RSS before start_run
      peak_gib            the same over the iterations (the peak counter reset after start-up)
      plan_startup_gib    Plan.startup (bytes per GPU at start-up)
      plan_total_gib      Plan.total (bytes per GPU in steady state)
      startup_ratio       startup_peak_gib / plan_startup_gib (<= 1: the planner is not short; with --smoke the
                          ratios set host RSS, library buffers included, against planned GPU bytes: only finite)
      peak_ratio          peak_gib / plan_total_gib
      flops_per_token     6 x parameters (full fine-tune) or 4 x parameters (LoRA: the frozen weights get no
                          weight gradient, so backward is ~2 x parameters a token, not 4)
      update_mfu          flops_per_token x trained_tokens / update_s / peak bf16 FLOP/s of the GPU; null
                          when the GPU is not in PEAK_BF16_FLOPS or on the CPU
      first_metrics, metrics   the first and the last iteration's records: losses, KL, rollout/learner log-prob
                          gap, padding share, throughput
  update_mfu          the full fine-tune's update_mfu (the headline number)
  defaults_vs_before  `compare`: the update's speed-up and the first iteration's losses and log-prob gap (null
                      with --smoke)

Every variant uses small batches (on a GPU rollout.n_env=16, ppo.e_len=4, rollout.max_tokens=16, one
mini-batch of 64 rows, 2 epochs; micro-batches of 8 rows in "before") so that the whole check stays under 10
minutes on one H100. Options: `--set key=value` (repeatable) adds an override to every variant (e.g.
dist.mixed_precision=true), `--iterations N` (default 2; the last one's update is timed), `--skip-tests`,
`--profile FILE` (one more update of "full" under torch.profiler, its ops table written to FILE).
Inner worker: `--worker NAME` (launched by the check itself under torchrun).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

import torch

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "configs" / "toy.yaml"
CUDA_TESTS = ["tests/integration/test_cuda.py"]
GIB = 2 ** 30

# the trainer's settings compared, each on top of the check's own overrides: "before" is the defaults this
# check measured first (fp32 FSDP parameters under bf16 autocast, micro-batches of optim.micro_batch_size rows)
VARIANTS = ("before", "full", "lora")
VARIANT_OVERRIDES = {"before": ["dist.mixed_precision=false", "optim.max_tokens_per_micro_batch=null"],
                     "lora": ["model.lora={r: 16}"]}

# dense bf16 tensor-core peak FLOP/s (vendor data sheets), by a substring of torch.cuda.get_device_name();
# the first match wins, so the more specific names come first
PEAK_BF16_FLOPS = [
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12),
    ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("B200", 2250e12),
]

# HBM bandwidth in bytes/s (vendor data sheets), matched as PEAK_BF16_FLOPS
PEAK_HBM_BYTES_PER_S = [
    ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("H200", 4.8e12), ("H800", 3.35e12),
    ("A100", 2.0e12), ("A800", 2.0e12), ("L40S", 0.864e12), ("B200", 8.0e12),
]

# Qwen2.5-1.5B-Instruct's config.json (hub), and a tiny model of the same family for --smoke; both keep the
# real vocabulary, since they are used with the real Qwen2.5 tokenizer
QWEN25_1_5B = {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
               "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
               "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "bos_token_id": 151643,
               "eos_token_id": 151645}
QWEN2_TINY = {**QWEN25_1_5B, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}


# ---------------------------------------------------------------------------------------------- helpers

def peak_bf16_flops(device_name: str) -> float | None:
    return next((flops for name, flops in PEAK_BF16_FLOPS if name in device_name), None)


def peak_bandwidth(device_name: str) -> float | None:
    return next((bandwidth for name, bandwidth in PEAK_HBM_BYTES_PER_S if name in device_name), None)


def build_model(folder: Path, dims: dict, device: torch.device):
    """A random Qwen2 causal LM of `dims` and the Qwen2.5 tokenizer, saved (bf16 weights) to `folder`:
    the `model.path` of the training runs. Returns (tokenizer, model) with the model in fp32 on `device`."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    sys.path.insert(0, str(ROOT / "tests"))
    from qwen25_tokenizer import build_qwen_tokenizer

    tokenizer = build_qwen_tokenizer()
    torch.manual_seed(0)
    with torch.device(device):                       # random init on the GPU: seconds, not a minute
        model = AutoModelForCausalLM.from_config(Qwen2Config(**dims), dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = dims["eos_token_id"]
    model.to(torch.bfloat16).save_pretrained(folder)   # in place: bf16 weights, as the hub's checkpoints are,
    tokenizer.save_pretrained(folder)
    return tokenizer, model.float()                      # back to fp32, the values the trainer loads


def bf16_vs_fp32(tokenizer, model, rows: int = 8) -> dict:
    """|log-prob under bf16 autocast - log-prob in fp32| of every token of `rows` chat prompts of different
    lengths (right-padded, as the learner's rows are), through the learner's own token_logprobs."""
    from horizonrl.learner.device import precision
    from horizonrl.learner.scoring import token_logprobs
    from horizonrl.samples.tensors import pad

    texts = [[{"role": "user", "content": f"You are on stone {i} of 9. The river runs left. " * (1 + 3 * i)}]
             for i in range(rows)]
    ids = [tokenizer(tokenizer.apply_chat_template(t, tokenize=False, add_generation_prompt=True)).input_ids
           for t in texts]
    device = model.device
    input_ids = pad(ids, tokenizer.pad_token_id, torch.long, device)
    attention = pad([[1] * len(r) for r in ids], 0, torch.long, device)
    mask = pad([[0] + [1] * (len(r) - 1) for r in ids], 0, torch.float32, device)
    logp = {}
    for name in ("fp32", "bf16"):
        with precision(name), torch.no_grad():
            logp[name] = token_logprobs(model, input_ids, attention, mask)[0].float()
    scored = mask.bool()
    diff = (logp["bf16"] - logp["fp32"])[scored].abs()
    return {"mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()), "tokens": int(scored.sum()),
            "fp32_logp_mean": float(logp["fp32"][scored].mean())}


def decode_speed(tokenizer, model, streams: int = 16, new_tokens: int = 64) -> dict:
    """The hf engine's decode rate, dynamic and at fixed shapes, against one batched `generate` and the
    memory-bandwidth bound, on a bf16 copy of `model`: `streams` concurrent requests of `new_tokens` sampled
    tokens each (ignore_eos: random weights), after one warm-up round.
        engine_tokens_per_s      {decode step: rate} of the hf engine (engines/hf.py), streams x new_tokens / wall
                                 time: "dynamic", and "graph" on CUDA ("static" on a CPU: its eager stand-in)
        fixed_shape_step         the fixed-shape engine's decode step after its rounds ("dynamic" if a recording
                                 failed: engines/decode_graph.py) and its recordings (one per cache buffer set)
        generate_tokens_per_s    transformers' model.generate of the same rows in one batch
        bandwidth_tokens_per_s   streams x HBM bytes/s / the bf16 weights' bytes: each decode step reads every
                                 weight once (KV reads left out: a bound from above); null without a known GPU
    """
    import asyncio

    from horizonrl.engines.base import SamplingParams
    from horizonrl.engines.hf import HFEngine
    from horizonrl.learner.models import pad_token_id

    bf16 = copy.deepcopy(model).to(torch.bfloat16).eval()
    prompts = [[int(t) for t in torch.randint(1000, 100000, (96,), generator=torch.Generator().manual_seed(i))]
               for i in range(streams)]
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0)       # no stop ids: every request runs to the end

    def timed(run) -> tuple[float, float]:
        synchronize(model.device)
        started = time.perf_counter()
        tokens = run()
        synchronize(model.device)
        return tokens, time.perf_counter() - started

    def engine_rate(decode_step: str) -> tuple[float, HFEngine]:
        engine = HFEngine(bf16, pad_token_id(tokenizer), max_batch_size=256, seed=0, tokenizer=tokenizer,
                          autocast_dtype=torch.bfloat16 if model.device.type == "cuda" else None,
                          decode_step=decode_step)

        async def round_of_requests() -> int:
            results = await asyncio.gather(*(engine.generate(prompt, params) for prompt in prompts))
            return sum(len(result.token_ids) for result in results)

        asyncio.run(round_of_requests())                                    # warm-up
        tokens, seconds = timed(lambda: asyncio.run(round_of_requests()))
        engine.close()
        return tokens / seconds, engine

    fixed_shape = "graph" if model.device.type == "cuda" else "static"
    rates = {"dynamic": engine_rate("dynamic")[0]}
    rates[fixed_shape], engine = engine_rate(fixed_shape)
    recordings = engine._static_decode.recordings if engine._static_decode else None   # None: a recording failed
    batch = torch.tensor(prompts, device=model.device)

    def generate(tokens: int) -> int:
        with torch.no_grad():
            bf16.generate(batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                          pad_token_id=pad_token_id(tokenizer))
        return streams * tokens

    generate(4)                                                          # warm-up
    tokens, seconds = timed(lambda: generate(new_tokens))
    bandwidth = peak_bandwidth(torch.cuda.get_device_name()) if model.device.type == "cuda" else None
    weight_bytes = sum(p.numel() for p in bf16.parameters()) * 2
    return {"streams": streams, "new_tokens": new_tokens,
            "engine_tokens_per_s": {step: round(rate, 1) for step, rate in rates.items()},
            "fixed_shape_step": {"decode_step": engine.decode_step, "recordings": recordings},
            "generate_tokens_per_s": round(tokens / seconds, 1),
            "bandwidth_tokens_per_s": round(streams * bandwidth / weight_bytes, 1) if bandwidth else None}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_cuda_tests() -> dict:
    """pytest on the CUDA test file(s); counts from its JUnit XML."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", *CUDA_TESTS, "-q", "-p", "no:cacheprovider",
                               f"--junitxml={report}"], check=False, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if not report.is_file():
            return {"passed": 0, "failed": None, "errors": None, "skipped": None, "seconds": seconds,
                    "output": done.stdout[-2000:] + done.stderr[-2000:]}
        suite = ElementTree.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    result = {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
              "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"],
              "seconds": round(seconds, 1)}
    if done.returncode != 0:
        result["output"] = done.stdout[-3000:]
    return result


# ------------------------------------------------------------------------- one variant, in its own process

class Memory:
    """Peak memory of this process since `reset()`, net of what it held at `start()`: CUDA's allocator
    counters on a GPU; on the CPU the resident set (VmHWM, reset through /proc/self/clear_refs)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    @staticmethod
    def _status(key: str) -> int:
        match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
        return int(match.group(1)) * 1024

    def start(self) -> None:
        self.base = torch.cuda.memory_allocated() if self.cuda else self._status("VmRSS")
        self.reset()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            Path("/proc/self/clear_refs").write_text("5")       # VmHWM := VmRSS

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        return self._status("VmHWM") - self.base


def worker(args) -> None:
    """One variant: start_run + `args.iterations` ppo_iterations of the real trainer on this rank (torchrun,
    one process), timed and measured; writes its JSON to args.out."""
    from horizonrl.config import load_config
    from horizonrl.envs.pool import open_envs
    from horizonrl.learner.device import precision
    from horizonrl.learner.distributed import start_ranks, stop_ranks
    from horizonrl.plan import plan
    from horizonrl.train import ppo
    from horizonrl.runstate.checkpoint import StopSignals
    from horizonrl.assembly.context import start_run

    cfg = load_config(TOY, args.overrides)
    updates = []
    minibatch_updates = ppo.minibatch_updates

    def timed_updates(data, mini_batch_size, budget, epochs, generator, steps, ranks):
        """The trainer's own update (critic and actor), timed, with the tokens it trains on."""
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        minibatch_updates(data, mini_batch_size, budget, epochs, generator, steps, ranks)
        if device.type == "cuda":
            torch.cuda.synchronize()
        updates.append({"update_s": time.perf_counter() - started,
                        "trained_tokens": int(data.attention_mask.sum()) * epochs * len(steps),
                        "rows": len(data), "seq_len": int(data.input_ids.shape[1])})

    def profiled_updates(data, mini_batch_size, budget, epochs, generator, steps, ranks):
        """The update under torch.profiler: its ops by device time, written to args.profile."""
        activities = [torch.profiler.ProfilerActivity.CPU] + \
            ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as profiler:
            minibatch_updates(data, mini_batch_size, budget, epochs, generator, steps, ranks)
            if device.type == "cuda":
                torch.cuda.synchronize()
        order = "device_time_total" if device.type == "cuda" else "cpu_time_total"
        table = profiler.key_averages().table(sort_by=order, row_limit=40, max_name_column_width=60)
        Path(args.profile).write_text(table)

    ppo.minibatch_updates = timed_updates          # ppo_iteration looks it up in its module at each call
    with precision(cfg.precision):                  # as train.loop.train does
        ranks, device = start_ranks(cfg.dist, cfg.device)
        if device.type == "cpu":
            torch.set_num_threads(1)
        torch.manual_seed(cfg.seed)
        streams = ranks.share(cfg.rollout.n_env)
        envs = open_envs(cfg.env.ids, cfg.env.kwargs, len(streams), cfg.env.workers, cfg.env.timeout_s,
                         streams.start)
        memory = Memory(device)
        memory.start()
        started = time.perf_counter()
        with StopSignals() as signals:
            ctx = start_run(cfg, envs, signals, None, ranks, device)
            startup_s, startup_peak = time.perf_counter() - started, memory.peak()
            memory.reset()
            iteration_s, records = [], []
            with ctx.metrics, contextlib.closing(ctx.engine), contextlib.closing(ctx.collector):
                for i in range(1, args.iterations + 1):
                    started = time.perf_counter()
                    records.append(ppo.ppo_iteration(ctx, i).record)
                    iteration_s.append(time.perf_counter() - started)
                peak = memory.peak()
                if args.profile:                    # one more iteration, its update profiled (not timed)
                    ppo.minibatch_updates = profiled_updates
                    ppo.ppo_iteration(ctx, args.iterations + 1)
            budget = ctx.micro_batch_budget
        for env in envs:
            env.close()
        stop_ranks(ranks)
    last = updates[-1]
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / GIB if device.type == "cuda" else 80.0
    ran = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"max_tokens_per_micro_batch": budget.tokens})})
    planned = plan(ran, gpus=1, gpu_memory_gib=gpu_gib, seq_len=max(u["seq_len"] for u in updates))   # its budget
    flops_per_token = (6 if cfg.model.lora is None else 4) * planned.parameters
    peak_flops = peak_bf16_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    def finite(record: dict) -> dict:
        return {key: value if math.isfinite(value) else None for key, value in record.items()
                if key.startswith(("train/", "perf/", "rollout/", "timing/")) and isinstance(value, (int, float))}

    result = {
        "micro_batch": {"rows": budget.rows} if budget.tokens is None else {"tokens": budget.tokens},
        "startup_s": round(startup_s, 2), "iteration_s": [round(s, 2) for s in iteration_s],
        **{key: round(value, 4) if isinstance(value, float) else value for key, value in last.items()},
        "startup_peak_gib": startup_peak / GIB, "peak_gib": peak / GIB,
        "plan_startup_gib": planned.startup / GIB, "plan_total_gib": planned.total / GIB,
        "startup_ratio": startup_peak / planned.startup, "peak_ratio": peak / planned.total,
        "flops_per_token": flops_per_token,
        "update_mfu": flops_per_token * last["trained_tokens"] / last["update_s"] / peak_flops if peak_flops else None,
        "first_metrics": finite(records[0]), "metrics": finite(records[-1]),
    }
    Path(args.out).write_text(json.dumps(result))


def run_variant(name: str, workdir: Path, overrides: list[str], iterations: int, profile: Path | None = None) -> dict:
    """`python -m torch.distributed.run --nproc_per_node 1 gpu_check.py --worker NAME ...`: its JSON."""
    out = workdir / f"{name}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--standalone",
               __file__, "--worker", name, "--out", str(out), "--iterations", str(iterations),
               *(["--profile", str(profile)] if profile else []), "--", *overrides]
    started = time.perf_counter()
    done = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        worker_output = (done.stdout + done.stderr).split("torch/distributed/elastic/multiprocessing/api.py")[0]
        return {"error": f"exit {done.returncode}", "output": worker_output[-4000:],
                "seconds": round(time.perf_counter() - started, 1)}
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------- the check

def compare(before: dict, defaults: dict) -> dict | None:
    """What the defaults (bf16 parameters, token-budget micro-batches) change against the earlier ones (fp32
    parameters under bf16 autocast, micro-batches of 8 rows): the update's speed-up, and on the first iteration
    (the same sampled rows: the engine is bf16 in both) the losses and the engine/learner log-prob gap."""
    if "error" in before or "error" in defaults:
        return None
    keys = ("train/actor/loss", "train/critic/loss", "train/actor/entropy", "rollout/logprob_abs_diff")
    first = {key: {"before": before["first_metrics"].get(key), "defaults": defaults["first_metrics"].get(key)}
             for key in keys}
    return {"update_speedup": round(before["update_s"] / defaults["update_s"], 2), "first_iteration": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU (the default without a GPU)")
    parser.add_argument("--iterations", type=int, default=2, help="training iterations per variant")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for both training variants (repeatable)")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the CUDA test file")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="profile one more update of the full fine-tune (defaults) and write its ops table here")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    started = time.perf_counter()
    smoke = args.smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    if smoke:
        torch.set_num_threads(1)
    result = {"device": "cpu" if smoke else torch.cuda.get_device_name(), "smoke": smoke}
    result["cuda_tests"] = None if smoke or args.skip_tests else run_cuda_tests()   # before this process uses CUDA

    with tempfile.TemporaryDirectory(prefix="gpu_check.") as tmp:
        workdir, model_dir = Path(tmp), Path(tmp) / "model"
        dims = QWEN2_TINY if smoke else QWEN25_1_5B
        tokenizer, model = build_model(model_dir, dims, device)
        result["model"] = {"parameters": sum(p.numel() for p in model.parameters()),
                           **{key: dims[key] for key in ("hidden_size", "num_hidden_layers", "vocab_size")}}
        result["bf16_vs_fp32"] = bf16_vs_fp32(tokenizer, model)
        result["decode"] = decode_speed(tokenizer, model, new_tokens=16 if smoke else 64)   # smoke: the path, fast
        del model
        gc.collect()             # the decode check's engine and bf16 copy sit in a reference cycle (engine <-> task)
        if not smoke:
            torch.cuda.empty_cache()                # the variants' processes get the whole GPU

        # 64 rows of ~260 tokens on a GPU; "before"'s micro-batches of 8 rows: `plan` put that at ~70 GiB
        n_env, e_len, rows = (2, 2, 4) if smoke else (16, 4, 8)
        common = [f"model.path={model_dir}", "model.warm_start=null", f"device={device.type}", "precision=auto",
                  "rollout.engine=hf", f"rollout.n_env={n_env}", f"ppo.e_len={e_len}", "rollout.max_tokens=16",
                  f"optim.mini_batch_size={n_env * e_len}", f"optim.micro_batch_size={rows}", "optim.epochs=2",
                  "report_to=[jsonl]", f"output_dir={workdir / 'runs'}", *args.extra]
        result["config"] = {"recipe": str(TOY.relative_to(ROOT)), "overrides": common, **VARIANT_OVERRIDES}
        result["variants"] = {
            name: run_variant(name, workdir, [*common, *VARIANT_OVERRIDES.get(name, [])], args.iterations,
                              args.profile if name == "full" else None)
            for name in VARIANTS if not (smoke and name == "before")}   # on a CPU the defaults are "before"
    result["update_mfu"] = result["variants"]["full"].get("update_mfu")
    result["defaults_vs_before"] = None if smoke else compare(result["variants"]["before"], result["variants"]["full"])
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
