"""The optional packages some built-in envs need (pyproject's extras `envs`, `textworld`, `gem`, `games`, `alfworld`):
tests skip an env only when a package it needs is not installed; every other error building or running it fails
them."""

import importlib.util

import pytest

OPTIONAL = {"crafter": ("crafter",), "textworld": ("textworld",), "gem": ("gem",), "openspiel": ("pyspiel",),
            "alfworld": ("alfworld", "fast_downward")}                                       # env family -> modules


def skip_unless_installed(env_id: str) -> None:
    """Skip the calling test when `env_id` (family: its id before "/" or ":") needs an optional package that is
    not installed."""
    for module in OPTIONAL.get(env_id.split("/")[0].split(":")[0], ()):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{env_id} needs the optional package {module!r}, which is not installed")
