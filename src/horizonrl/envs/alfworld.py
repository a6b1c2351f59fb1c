"""ALFWorld (Shridhar et al., 2021): ALFRED's household tasks as text games, played through TextWorld's PDDL engine.

The games are data, not code: `alfworld-download` (pip install 'horizonrl[alfworld]') fetches them from GitHub into
$ALFWORLD_DATA (default ~/.cache/alfworld), as

    json_2.1.1/<split>/<task type>-<object>-<...>-<receptacle>-<scene>/<trial>/game.tw-pddl

with the splits `train` (~3,500 games), `valid_seen` and `valid_unseen` (the field's held-out set). `task` keeps
one of the six task types (TASK_TYPES) or `all`; games the ALFWorld loader skips are skipped here too (movable or
sliced objects, games not marked solvable). The seed picks a game: the sorted list's entry seed % its length.

An episode shows the room ("You are in the middle of a room. Looking quickly around you, you see ..."); the
mission is the task line ("put a clean apple in fridge"). Like TextWorldEnv, the actions are the commands the game
accepts now ("go to fridge 1", "take apple 1 from countertop 1", ...), refreshed after every step. Reward 1 and
success when the goal holds; truncated after `max_steps` (50, the field's budget).

`expert_action()` asks Fast Downward (the planner ALFWorld ships as `textworld[pddl]`) for a plan from the current
state, so `horizonrl sft` can warm-start on it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import fast_downward  # noqa: F401  the planner textworld's PDDL engine plays ALFWorld with (textworld[pddl])
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

from horizonrl.envs import ALFWORLD_DATA
from horizonrl.envs.base import Instruction
from horizonrl.envs.textworld import TextWorldEnv, _quiet, _textworld

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
SPLITS = ("train", "valid_seen", "valid_unseen")
TASK_LINE = re.compile(r"^Your task is to: (.*?)\.?$", re.MULTILINE)
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"


def game_files(folder: Path, task: str) -> list[Path]:
    """The split folder's game files of `task` (a type of TASK_TYPES, or "all"), sorted; what ALFWorld's own
    loader skips (movable and sliced objects) is left out."""
    games = []
    for path in sorted(folder.glob("*/*/game.tw-pddl")):
        task_dir = path.parent.parent.name
        if "movable" in str(path.parent) or "Sliced" in str(path.parent):
            continue
        if task == "all" or task_dir.split("-")[0] == task:
            games.append(path)
    return games


class ALFWorld(TextWorldEnv):
    """TextWorldEnv's step and state_key over ALFWorld's games: its own game list, instruction and reset."""

    default_action = "look"
    translations = {"look around": "look", "l": "look", "i": "inventory", "inv": "inventory",
                    "check inventory": "inventory"}

    def __init__(self, task: str = "all", split: str = "train", max_steps: int = 50,
                 data_dir: str | os.PathLike | None = None):
        self._tw = _textworld()
        if task != "all" and task not in TASK_TYPES:
            raise ValueError(f"unknown ALFWorld task {task!r}; known: all, {', '.join(TASK_TYPES)}")
        if split not in SPLITS:
            raise ValueError(f"unknown ALFWorld split {split!r}; known: {', '.join(SPLITS)}")
        self.task, self.split = task, split
        self.folder = (Path(data_dir) if data_dir is not None else ALFWORLD_DATA.folder()) / ALFWORLD_DATA.probe / split
        self.games: list[Path] | None = None       # listed at the first reset
        self._before_the_first_game(max_steps)

    @property
    def instruction(self) -> Instruction:
        return Instruction(
            intro="You are an agent in a house, doing a household task through text commands",
            mission=self.objective or "do the household task",
            actions={command: "" for command in self.actions},
            tips=["the listed actions are the commands the game understands right now; they change as you play",
                  "'go to' a receptacle to see what is on or in it; open closed ones",
                  "heat with the microwave, cool with the fridge, clean with the sink basin"],
        )

    def game_file(self, seed: int) -> Path:
        """The game `seed` plays: the first game marked solvable from entry seed % n of the sorted list on."""
        if self.games is None:
            self.games = game_files(self.folder, self.task)
            if not self.games:
                raise ValueError(f"no ALFWorld games of task {self.task!r} under {self.folder}; "
                                 f"get them with `{ALFWORLD_DATA.fetch}`")
        for offset in range(len(self.games)):
            path = self.games[(seed + offset) % len(self.games)]
            if json.loads(path.read_text()).get("solvable", False):
                return path
        raise ValueError(f"none of the {len(self.games)} ALFWorld games under {self.folder} is marked solvable")

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        tw = self._tw
        game = self.game_file(seed)
        if self._env is not None:
            self._env.close()
        wanted = tw.EnvInfos(feedback=True, admissible_commands=True, won=True, lost=True, extras=["gamefile"])
        with _quiet():
            self._env = tw.start(str(game), wanted, wrappers=[AlfredDemangler(), AlfredInfos])
            state = self._env.reset()
        found = TASK_LINE.search(state["feedback"])
        self.objective = found.group(1).strip() if found else ""
        self.score, self.steps = 0, 0
        self.actions = list(state["admissible_commands"])
        self.shown = TASK_LINE.sub("", state["feedback"].replace(WELCOME, "")).strip()
        return self.shown, {}

    def expert_action(self) -> tuple[str, str]:
        """The first command of Fast Downward's plan from the current state, and the plan's length as the reason."""
        if self._env is None:
            raise RuntimeError("call reset(seed) before expert_action")
        game = self._env.unwrapped   # the PddlEnv: its planner state and the demangled entity names
        plan = game._pddl_state.replan(game._entity_infos)
        if not plan:
            return self.default_action, "no plan reaches the goal from here"
        shown = f"{', '.join(plan[:4])}{' ...' * (len(plan) > 4)}"
        return plan[0], f"{len(plan)} command{'s' * (len(plan) > 1)} to the goal: {shown}"
