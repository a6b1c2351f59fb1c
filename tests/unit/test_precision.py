"""`precision`: which autocast the learner and the hf engine run under, on each device."""

import pytest
import torch

from horizonrl.learner.device import autocast_dtype, precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("amx, cpu_dtype", [("0", None), ("1", torch.bfloat16)])
def test_auto_is_bf16_on_cuda_and_on_cpus_with_amx(monkeypatch, amx, cpu_dtype):
    monkeypatch.setenv("HORIZONRL_CPU_BF16", amx)
    with precision("auto"):
        assert autocast_dtype(CPU) is cpu_dtype
        assert autocast_dtype(CUDA) is torch.bfloat16


def test_fp32_and_bf16_hold_on_every_device_and_end_with_their_block(monkeypatch):
    monkeypatch.setenv("HORIZONRL_CPU_BF16", "1")
    with precision("fp32"):
        assert autocast_dtype(CPU) is None and autocast_dtype(CUDA) is None
        with precision("bf16"):
            assert autocast_dtype(CPU) is torch.bfloat16
        assert autocast_dtype(CPU) is None
    monkeypatch.setenv("HORIZONRL_CPU_BF16", "0")
    assert autocast_dtype(CPU) is None          # back to auto


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision: 'fp16' is not one of auto, fp32, bf16"):
        with precision("fp16"):
            pass
