"""Environment registry: `make(env_id, **kwargs)` builds a TextEnv by id.

An entry names its class as "module:Class" and is imported only when used, so an env whose package is
not installed (textworld is an optional extra) costs nothing until someone asks for it.
Add your own with `register("my-env", MyEnv, size=8)`.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from horizonrl.envs import gem_games, openspiel_games, textarena_games
from horizonrl.envs.base import Instruction, TextEnv


@dataclass(frozen=True)
class GameData:
    """Files an env reads that no package installs (ALFWorld's games): the folder they go in, named by an
    environment variable (`default` when it is unset), a path inside it that exists once they are there, and
    the one command that fetches them."""

    env_var: str
    default: str
    probe: str
    fetch: str

    def folder(self) -> Path:
        return Path(os.path.expanduser(os.environ.get(self.env_var) or self.default))

    def missing(self) -> str | None:
        """None when the data is in place; else one line: where it goes and how to get it."""
        if (self.folder() / self.probe).exists():
            return None
        return (f"its data is missing: no {self.probe} in {self.folder()} (${self.env_var}); "
                f"get it with `{self.fetch}`, or point ${self.env_var} at a copy")


@dataclass(frozen=True)
class EnvSpec:
    factory: str | Callable[..., TextEnv]   # "module:Class" (imported on first use) or the class itself
    kwargs: dict = field(default_factory=dict)
    description: str = ""
    extra: str | None = None                  # the pip extra that installs what it needs
    data: GameData | None = None              # the files it reads that no package installs


def _babyai(task: str, description: str) -> EnvSpec:
    return EnvSpec("horizonrl.envs.babyai:BabyAIEnv", {"task": task}, description, "envs")


def _babaisai(task: str, description: str) -> EnvSpec:
    return EnvSpec("horizonrl.envs.babaisai:BabaIsAIEnv", {"task": task}, description)


def _textworld(kind: str, description: str) -> EnvSpec:
    return EnvSpec("horizonrl.envs.textworld:TextWorldEnv", {"kind": kind}, description, "textworld")


ALFWORLD_DATA = GameData("ALFWORLD_DATA", "~/.cache/alfworld", "json_2.1.1", "alfworld-download")


REGISTRY: dict[str, EnvSpec] = {
    "river": EnvSpec("horizonrl.envs.river:River", {}, "toy: cross stepping stones by reading each observation"),
    "babyai/goto": _babyai("goto", "BabyAI: go to an object in the room"),
    "babyai/pickup": _babyai("pickup", "BabyAI: pick up an object"),
    "babyai/open": _babyai("open", "BabyAI: open a door"),
    "babyai/pick_up_seq_go_to": _babyai("pick_up_seq_go_to", "BabyAI: pick up an object, then go to another"),
    "babyai/putnext": _babyai("putnext", "BabyAI: put an object next to another"),
    "babaisai/goto_win-distr_obj": _babaisai("goto_win-distr_obj",
                                             "BabaIsAI: walk to the WIN object past a distractor"),
    "babaisai/two_room-goto_win": _babaisai("two_room-goto_win", "BabaIsAI: reach the WIN object in the other room"),
    "babaisai/two_room-goto_win-distr_obj_rule": _babaisai(
        "two_room-goto_win-distr_obj_rule", "BabaIsAI: two rooms, a distractor object and a distractor rule"),
    "babaisai/two_room-maybe_break_stop-goto_win": _babaisai(
        "two_room-maybe_break_stop-goto_win", "BabaIsAI: two rooms; sometimes WALL IS STOP must be broken"),
    "sokoban/6x6-1box": EnvSpec("horizonrl.envs.sokoban:Sokoban", {"size": 6, "boxes": 1},
                                "Sokoban: push the box onto the target in a generated 6x6 room"),
    "sokoban/6x6-2box": EnvSpec("horizonrl.envs.sokoban:Sokoban", {"size": 6, "boxes": 2},
                                "Sokoban: push both boxes onto the targets in a generated 6x6 room"),
    "frozenlake/4x4": EnvSpec("horizonrl.envs.frozenlake:FrozenLake", {"size": 4},
                              "FrozenLake: reach the goal around the holes of a random 4x4 map"),
    "frozenlake/8x8": EnvSpec("horizonrl.envs.frozenlake:FrozenLake", {"size": 8},
                              "FrozenLake: reach the goal around the holes of a random 8x8 map"),
    "crafter": EnvSpec("horizonrl.envs.crafter:CrafterEnv", {}, "Crafter: survive and unlock 22 achievements", "envs"),
    "textworld/simple": _textworld("simple", "TextWorld: a small generated house quest"),
    "textworld/coin_collector": _textworld("coin_collector", "TextWorld: find the coin through connected rooms"),
    "textworld/treasure_hunter": _textworld("treasure_hunter", "TextWorld: find a named object in the house"),
    "alfworld": EnvSpec("horizonrl.envs.alfworld:ALFWorld", {}, "ALFWorld: household tasks in text (task= picks one of "
                        "its six types)", "alfworld", ALFWORLD_DATA),
}
REGISTRY.update({f"gem:{game}": EnvSpec("horizonrl.envs.gem_env:GemGame", {"game": game}, f"GEM: {game}", "gem")
                 for game in gem_games.GAMES})
REGISTRY.update({f"openspiel:{game}": EnvSpec("horizonrl.envs.openspiel_env:OpenSpielEnv", {"game": game},
                                              f"OpenSpiel: {text.intro.removeprefix('You are playing ')} (opponent= "
                                              "random, mcts:N, perfect or self; seat= 0, 1 or alternate)", "games")
                 for game, text in openspiel_games.TEXTS.items()})
REGISTRY.update({f"textarena:{game}": EnvSpec("horizonrl.envs.textarena_env:TextArenaEnv", {"game": game},
                                              f"TextArena: {about} (self-play; window= messages kept)", "games")
                 for game, (about, _) in textarena_games.GAMES.items()})


REFUSALS = {"gem:": gem_games.refusal, "textarena:": textarena_games.refusal}   # prefix -> why a game is not played


def register(env_id: str, factory: str | Callable[..., TextEnv], description: str = "", **kwargs) -> None:
    """Make `env_id` buildable by `make` (and so by `env.id` in a config)."""
    REGISTRY[env_id] = EnvSpec(factory, kwargs, description)


def spec(env_id: str) -> EnvSpec:
    if env_id not in REGISTRY:
        for prefix, refusal in REFUSALS.items():   # a game an adapter does not play: why not
            if env_id.startswith(prefix):
                raise ValueError(refusal(env_id.removeprefix(prefix)))
        raise ValueError(f"unknown env {env_id!r}; known envs: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[env_id]


def factory(env_id: str) -> Callable[..., TextEnv]:
    """The class behind `env_id`, imported now; a missing package or missing data is one message saying what
    to install or fetch."""
    entry = spec(env_id)
    if not isinstance(entry.factory, str):
        return entry.factory
    module, _, name = entry.factory.partition(":")
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        hint = f": pip install 'horizonrl[{entry.extra}]'" if entry.extra else ""
        then = f", then `{entry.data.fetch}` for its data" if entry.data and entry.data.missing() else ""
        raise ValueError(f"env {env_id!r} needs a package that is not installed ({error}){hint}{then}") from None
    if not hasattr(imported, name):
        raise ValueError(f"env {env_id!r}: module {module} has no {name}")
    if entry.data and (missing := entry.data.missing()):
        raise ValueError(f"env {env_id!r} cannot run: {missing}")
    return getattr(imported, name)


def check_kwargs(env_id: str, kwargs: dict) -> None:
    """Raise ValueError when `kwargs` do not fit the env: its constructor does not take them, or rejects
    their values (an unknown task, max_steps < 1). The values are checked by building one env, so a
    constructor should only check and store its arguments and leave the work to `reset`."""
    env_class = factory(env_id)
    try:
        inspect.signature(env_class).bind(**{**spec(env_id).kwargs, **kwargs})
        make(env_id, **kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(f"kwargs do not fit env {env_id!r}: {error}") from None


def make(env_id: str, **kwargs) -> TextEnv:
    """Build the env registered as `env_id`; an unknown id is one clear error listing the known ones."""
    return factory(env_id)(**{**spec(env_id).kwargs, **kwargs})


__all__ = ["EnvSpec", "GameData", "Instruction", "REGISTRY", "TextEnv", "check_kwargs", "factory", "make", "register",
           "spec"]
