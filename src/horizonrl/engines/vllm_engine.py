"""In-process vLLM engine: `vllm.LLM` over a copy of the actor's weights, synced in place after updates.

The engine is built from an untied copy of the actor (engines/weights.py: streamed in bounded shards)
written to its weights folder (the run's engine_weights/rank<R> in training, rollout.vllm.weights_dir,
or a temporary folder). Requests are continuously batched by vLLM's scheduler: a worker thread adds
the requests that arrived to vLLM's `LLMEngine` and steps it, resolving each request's future as soon
as its response ends, while the event loop keeps stepping envs (the pattern of HFEngine).
`sync_weights` rewrites that folder's weights from the actor's state dict and, with vLLM's scheduler
paused (`sleep(level=0, mode="keep")`: its engine process steps on its own), has every vLLM worker reload
them in place (`collective_rpc("reload_weights", weights_path=...)`: no restart; a callable or tensors sent
by RPC would need vLLM's pickle fallback, VLLM_ALLOW_INSECURE_SERIALIZATION), then resets the prefix cache,
whose KV the old weights computed, preempting the requests in flight (`reset_running_requests`): under
asynchronous training they go on after the sync, their prompt and the tokens sampled so far recomputed by
the new weights, so no token is sampled over KV of the old ones; a reset that fails is an error, never a
stale cache kept. (On GPUs vLLM 0.32 also has an in-memory path that skips the folder, its CUDA-IPC weight
transfer, `weight_transfer_config={"backend": "ipc"}`, which this engine does not use.)

Log-probs are vLLM's `processed_logprobs`: the sampled token's log-prob after temperature and top-p,
the distribution it was sampled from (for greedy requests, the untempered one), as HFEngine returns
and the learner computes. A request's `grammar` goes to vLLM as structured outputs
(`StructuredOutputsParams(grammar=...)`, compiled by its default backend, xgrammar, as HFEngine compiles
it); vLLM applies the grammar's bitmask to the logits before its sampler, so these log-probs are then those
of the masked, renormalised distribution, as HFEngine's (engines/constrained.py; unlike HFEngine, vLLM's
xgrammar backend lets a special token spell its text inside a JSON string). Each request carries a seed
from `RequestSeeds`, so the same requests sample the same tokens alone or batched, in any order of arrival.
Stop ids end a response (kept in it, EOS only when it is a stop id); stop patterns are checked once the
response ends (`cut_at_stop_pattern`). A response vLLM ended otherwise than by a stop or its length ("abort",
"error") is not whole: its request fails with a RuntimeError (`finish_reason`, engines/base.py, shared with the
openai engine).

vLLM starts its engine core in a spawned process: a script that builds this engine at import time
needs the `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import tempfile
import threading
from pathlib import Path

import torch

from horizonrl.engines.base import (Generation, RequestSeeds, SamplingParams, ScoredRow, check_grammar,
                                    cut_at_stop_pattern, finish_reason, settle)
from horizonrl.engines.registry import VLLM_INSTALL
from horizonrl.engines.retry import EngineError
from horizonrl.engines.weights import remove_weights, write_untied
from horizonrl.errors import ConfigError

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RELOAD_TIMEOUT_S = 600      # reading a 7B model's weights from disk takes well under a minute
CPU_BATCHED_TOKENS = 8192   # vLLM's own default for vllm.LLM on the CPU


def import_vllm():
    """The vllm package; a ConfigError with the install line when it is missing."""
    try:
        import vllm
    except ImportError as error:
        raise ConfigError(f"rollout.engine=vllm needs vLLM, which does not import ({error}): {VLLM_INSTALL}") from None
    return vllm


def check_cpu_head_dim(config) -> None:
    """A one-line ConfigError when vLLM's CPU attention has no kernel for the model's head size."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ConfigError(f"vLLM on the CPU supports head sizes {supported}; this model's is {head_dim} (hidden_size / "
                         "num_attention_heads): pick model.tiny sizes that give one of them, or rollout.engine=hf")


class VLLMEngine:
    """Engine over `vllm.LLM`, sampling from a copy of `model`'s weights (see the module docstring).

    `dtype`: the weights' dtype in vLLM (float32 reproduces the learner's log-probs to ~1e-6; bfloat16
    to ~4e-2). `gpu_memory_utilization`: on the CPU, the share of the NUMA node's memory for the KV
    cache. With `enable_sleep_mode` (GPU only) `sleep` frees vLLM's weights and KV cache for the update
    and `sync_weights` wakes it. `folder`: where the weights are written and reloaded from (None: a
    temporary folder). `close` stops vLLM's processes and removes the weights (a temporary folder whole).
    `enforce_eager`: skip vLLM's torch.compile of the model (rollout.vllm.enforce_eager: a faster start,
    a slower decode).

    `device` (None: the model's): where vLLM runs. On cuda:i its workers get GPUs i .. i +
    tensor_parallel_size - 1 (vLLM's `device_ids`, indices among the visible GPUs as torch numbers them);
    vLLM itself would take cuda:0 onwards in every process, so under torchrun every rank's engine would
    share the first GPU instead of running on its rank's (cuda:LOCAL_RANK)."""

    def __init__(self, model, tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32,
                 gpu_memory_utilization: float = 0.2, tensor_parallel_size: int = 1,
                 enable_prefix_caching: bool = True, max_num_seqs: int = 256, max_model_len: int | None = None,
                 enable_sleep_mode: bool = False, device: torch.device | None = None, tensors=None,
                 folder: Path | None = None, enforce_eager: bool = False):
        vllm = import_vllm()
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.seeds = RequestSeeds(seed)
        device = device or next(model.parameters()).device
        on_gpu = device.type == "cuda"
        if not on_gpu:
            check_cpu_head_dim(model.config)
        if enable_sleep_mode and not on_gpu:
            log.info("rollout.vllm.enable_sleep_mode is a no-op on the CPU: vLLM's CPU backend has no sleep mode")
        self.sleep_mode = enable_sleep_mode and on_gpu
        self._sleeping = False
        self._temporary = tempfile.TemporaryDirectory(prefix="horizonrl-vllm-") if folder is None else None
        self.folder = write_untied(model, tokenizer, folder or Path(self._temporary.name), dtype, tensors)
        if on_gpu:
            first = device.index if device.index is not None else torch.cuda.current_device()
            placement = {"device_ids": list(range(first, first + tensor_parallel_size))}
        else:   # a seeded request whose prompt is prefilled in chunks kills vLLM 0.32's engine on the CPU ("CPU
                # Generator does not use offset"): prompts are prefilled whole there
            placement = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(
                max_model_len or model.config.max_position_embeddings, CPU_BATCHED_TOKENS)}
        self.llm = vllm.LLM(model=str(self.folder), dtype=dtype, seed=seed, logprobs_mode="processed_logprobs",
                            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                            enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
                            max_model_len=max_model_len, enable_sleep_mode=self.sleep_mode,
                            enforce_eager=enforce_eager, **placement)
        self._vllm = vllm
        self._ids = itertools.count()
        self._lock = threading.Lock()  # guards _pending, _working and _running, shared with the worker thread
        self._stepping = threading.Lock()  # held by the worker's engine step and by a weight update
        self._pending: list[tuple[str, list[int], object, asyncio.Future, int]] = []
        self._running: dict[str, tuple[asyncio.Future, int]] = {}   # in vLLM: id -> (future, weights version)
        self._working = False
        self.in_flight_at_sync = 0  # requests pending or running when the weights last changed
        self._server: asyncio.Task | None = None

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        check_grammar(params)
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            seed = self.seeds.next(prompt_ids, params.seed)
            self._pending.append((str(next(self._ids)), list(prompt_ids), self._sampling(params, seed), future,
                                  self.seeds.version))
            start, self._working = not self._working, True
        if start:
            self._server = asyncio.create_task(asyncio.to_thread(self._run))
        return cut_at_stop_pattern(await future, self.tokenizer, params.stop_patterns)

    def _sampling(self, params: SamplingParams, seed: int):
        """vLLM's sampling parameters for `params`: only our stop ids end a response (not EOS on its
        own), no detokenising (we never use vLLM's text), the sampled token's log-prob only, the grammar
        as structured outputs."""
        structured = (None if params.grammar is None
                      else self._vllm.sampling_params.StructuredOutputsParams(grammar=params.grammar))
        return self._vllm.SamplingParams(
            max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p, seed=seed,
            stop_token_ids=list(params.stop_ids), ignore_eos=True, logprobs=0, detokenize=False,
            structured_outputs=structured, output_kind=self._vllm.sampling_params.RequestOutputKind.FINAL_ONLY)

    def _run(self) -> None:
        """Worker thread: add the requests that arrived, step vLLM, settle the ones that ended; until
        nothing is running or pending (decided under the lock, so the next `generate` starts a worker).
        vLLM's step waits for an output of the requests it holds, forever when it holds none, so whether any
        runs is read after adding them, with `_stepping` held: a `score` that stepped the engine before may
        have settled every one, and every arrival may have been refused."""
        engine, running = self.llm.llm_engine, self._running
        while True:
            try:
                with self._stepping:
                    with self._lock:
                        arrived, self._pending = self._pending, []
                        if not arrived and not running:
                            self._working = False
                            return
                        add_requests(engine, arrived, running, self._vllm.exceptions.VLLMClientError)
                    outputs = engine.step() if running else []
            except Exception as error:  # every request the engine holds or was adding learns about it
                with contextlib.suppress(Exception):   # a dead engine cannot abort: its requests are gone anyway
                    engine.abort_request(list(running))
                for future, _ in running.values():
                    settle(future, RuntimeError(f"vLLM failed: {type(error).__name__}: {error}"))
                running.clear()
                continue
            for output in outputs:
                self._settle(output)

    def _settle(self, output) -> None:
        """Resolve the future of a request that `output` says has ended (nothing while it runs)."""
        if not output.finished:
            return
        with self._lock:
            future, version = self._running.pop(output.request_id)
        try:
            outcome = _generation(output, version)
        except RuntimeError as error:   # a response that is not whole fails its own request
            outcome = error
        settle(future, outcome)

    def score(self, rows: list[ScoredRow]) -> list[list[float]]:
        """As TrainingEngine.score: vLLM's prompt log-probs of each row (prompt and response as one prompt, the
        one token sampled after it dropped), at temperature 1. The engine is stepped here while the worker thread
        waits (`_stepping`); the worker's requests that these steps end are settled as the worker settles them."""
        engine = self.llm.llm_engine
        sampling = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False,
                                             output_kind=self._vllm.sampling_params.RequestOutputKind.FINAL_ONLY)
        rows_by_id = {f"score-{next(self._ids)}": row for row in rows}
        scored = {}
        with self._stepping:
            for request_id, row in rows_by_id.items():
                engine.add_request(request_id, {"prompt_token_ids": row.prompt_ids + row.response_ids}, sampling)
            while len(scored) < len(rows_by_id):
                for output in engine.step():
                    if output.request_id not in rows_by_id:
                        self._settle(output)
                    elif output.finished:
                        scored[output.request_id] = output.prompt_logprobs
        return [[entry[token].logprob for entry, token in zip(scored[request_id][-len(row.response_ids):],
                                                               row.response_ids)]
                for request_id, row in rows_by_id.items()]

    def sync_weights(self, model, tensors=None) -> None:
        """Sample from `model`'s weights from now on: every tensor of its state dict (tied ones under
        each name) written to the folder (vLLM reads it only when told to reload), then, with vLLM's scheduler
        paused, reloaded in place and the prefix cache reset with the requests in flight preempted (see the
        module docstring); they keep the version they started under."""
        if self._sleeping:
            self.llm.wake_up()
            self._sleeping = False
        write_untied(model, self.tokenizer, self.folder, self.dtype, tensors)
        with self._stepping:
            self.llm.sleep(level=0, mode="keep")    # vLLM's engine process steps on its own: pause it
            try:   # a bound on the workers' reload (vLLM enforces it in its engine process)
                self.llm.collective_rpc("reload_weights", timeout=RELOAD_TIMEOUT_S,
                                        kwargs={"weights_path": str(self.folder)})
                reset = self.llm.reset_prefix_cache(reset_running_requests=True)
            except TimeoutError as error:
                raise EngineError(f"vLLM did not reload the weights within {RELOAD_TIMEOUT_S} s: {error}") from None
            finally:
                self.llm.wake_up(tags=["scheduling"])
            if not reset:
                raise EngineError("vLLM could not reset its prefix cache after a weight update: blocks are still held "
                                  "(a KV transfer in flight?); the old weights' KV would be reused")
            with self._lock:
                self.in_flight_at_sync = len(self._pending) + len(self._running)
                self.seeds.new_version()

    def sleep(self) -> None:
        """With sleep mode (GPU): free vLLM's weights and KV cache until the next `sync_weights`."""
        if self.sleep_mode and not self._sleeping:
            self.llm.sleep(level=1)
            self._sleeping = True

    @property
    def weights_version(self) -> int:
        return self.seeds.version

    def state_dict(self) -> dict:
        """The weights version, as HFEngine keeps it (the weights themselves are the actor's)."""
        return {"weights_version": self.weights_version}

    def load_state_dict(self, state: dict) -> None:
        self.seeds.new_version(state["weights_version"])

    def close(self) -> None:
        """Stop vLLM's engine processes and remove the weights (a temporary folder whole)."""
        self.llm.llm_engine.engine_core.shutdown()
        if self._temporary is None:
            remove_weights(self.folder)
        else:
            self._temporary.cleanup()


def add_requests(engine, arrived: list[tuple[str, list[int], object, asyncio.Future, int]],
                 running: dict[str, tuple[asyncio.Future, int]], refusal: type[Exception]) -> None:
    """Add the `arrived` requests (id, prompt ids, vLLM sampling parameters, future, weights version) to
    vLLM's `engine` and to `running`. A request the engine refuses for its own sake (`refusal`: vLLM's
    VLLMClientError) is settled alone with a ValueError (not retried: sent again, it fails again), and the
    others go on: `refusal_message` says why. Any other error is the engine's: it propagates with every
    arrival already in `running`, so that none of them is left unsettled."""
    running.update((request_id, (future, version)) for request_id, _, _, future, version in arrived)
    for request_id, prompt_ids, sampling, future, _ in arrived:
        try:
            engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, sampling)
        except refusal as error:
            del running[request_id]
            settle(future, ValueError(refusal_message(request_id, len(prompt_ids),
                                                      engine.model_config.max_model_len, error)))


def refusal_message(request_id: str, prompt_len: int, max_model_len: int, error: Exception) -> str:
    """Why vLLM refused request `request_id`. vLLM samples at least one token, so it refuses a prompt of
    max_model_len tokens or more (a longer response is only cut at max_model_len, with finish reason
    "length"): such a prompt is named as too long, with what to change; any other refusal (a grammar it
    cannot compile, a sampling parameter it does not take) is vLLM's own message."""
    if prompt_len + 1 > max_model_len:
        return (f"vLLM refused a request with a {prompt_len}-token prompt (max_model_len is {max_model_len}, and the "
                f"response needs at least one token): {error}; raise rollout.vllm.max_model_len (up to the model's "
                "max_position_embeddings) or send shorter prompts")
    return f"vLLM refused request {request_id} (a {prompt_len}-token prompt, within max_model_len): {error}"


def _generation(output, weights_version: int) -> Generation:
    """Our Generation from a finished vLLM RequestOutput (one completion); a RuntimeError when it is not whole."""
    completion = output.outputs[0]
    reason = finish_reason(completion.finish_reason, f"vLLM request {output.request_id}")
    token_ids = list(completion.token_ids)
    logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs, token_ids)]
    return Generation(token_ids, logprobs, reason, weights_version)
