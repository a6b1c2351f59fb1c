"""The optional packages some built-in envs need (pyproject's extras `envs`, `textworld` and `gem`): tests skip
an env only when its package is not installed; every other error building or running it fails them."""

import importlib.util

import pytest

OPTIONAL = {"crafter": "crafter", "textworld": "textworld", "gem": "gem"}   # env family (id before "/" or ":") -> module


def skip_unless_installed(env_id: str) -> None:
    """Skip the calling test when `env_id` needs an optional package that is not installed."""
    module = OPTIONAL.get(env_id.split("/")[0].split(":")[0])
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"{env_id} needs the optional package {module!r}, which is not installed")
