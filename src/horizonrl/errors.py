"""The errors every room may raise about the run's configuration; the bottom room, so that a room below
config.py (an engine refusing a model its backend cannot run, a registry refusing a name) names a config problem
as config.py does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Row = TypeVar("Row")


class ConfigError(ValueError):
    """A configuration problem, with a message meant for the user."""


def look_up(table: Mapping[str, Row], name: str, kind: str) -> Row:
    """table[name]; an unknown name is a ValueError listing the names ("unknown engine 'x'; the engines: ...")."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; the {kind}s: {', '.join(table)}") from None
