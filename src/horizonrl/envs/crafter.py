"""Crafter: the open-world 2D survival game (Hafner, 2021) as a TextEnv.

The agent gathers materials, crafts tools, eats, drinks and sleeps in a generated 64x64 world and is
scored on 22 achievements (collect wood, place a table, make a wood pickaxe, ... collect a diamond).
Each achievement unlocked for the first time is worth reward 1; crafter also adds 0.1 per health point
gained and subtracts 0.1 per point lost. We pass crafter's reward through unchanged.

The observation describes the window crafter draws (with the default `view=9`: 4 cells to each side
east/west and 3 north/south): for every kind of material or creature in it, the nearest one with its
Manhattan distance and direction ("tree 3 steps to your north-west (1 north, 2 west)"), nearest first;
then what the player faces, its status (health, food, drink, energy, 0 to 9), whether it sleeps or it
is night, and its inventory. North is up on crafter's map (`Move North` is crafter's `move_up`).

An episode ends when the player dies (terminated) or after `max_steps` steps (truncated). Success is
unlocking all 22 achievements; progress is the fraction unlocked. `reset(seed)` builds a fresh
crafter.Env with that seed, so the same seed gives the same world (world generation takes about 1.5 s).
"""

from __future__ import annotations

import math
from typing import Any

import crafter
from crafter import constants

from horizonrl.envs.base import Instruction, state_digest

# Our action name -> crafter's action name; crafter's action index is constants.actions.index(name).
CRAFTER_NAMES = {
    "Noop": "noop",
    "Move West": "move_left",
    "Move East": "move_right",
    "Move North": "move_up",
    "Move South": "move_down",
    "Do": "do",
    "Sleep": "sleep",
    "Place Stone": "place_stone",
    "Place Table": "place_table",
    "Place Furnace": "place_furnace",
    "Place Plant": "place_plant",
    "Make Wood Pickaxe": "make_wood_pickaxe",
    "Make Stone Pickaxe": "make_stone_pickaxe",
    "Make Iron Pickaxe": "make_iron_pickaxe",
    "Make Wood Sword": "make_wood_sword",
    "Make Stone Sword": "make_stone_sword",
    "Make Iron Sword": "make_iron_sword",
}
ACHIEVEMENTS = list(constants.achievements)
STATUS = ("health", "food", "drink", "energy")
NIGHT_BELOW = 0.5   # crafter starts darkening the image when daylight drops under 0.5


def _spaced(name: str) -> str:
    return name.replace("_", " ")


def _uses(cost: dict[str, int]) -> str:
    return ", ".join(f"{n} {_spaced(item)}" for item, n in cost.items())


def _describe(crafter_name: str) -> str:
    """One line per action, built from crafter's own rules so it matches the installed version."""
    fixed = {
        "noop": "do nothing this step",
        "move_left": "move one cell west, or turn west if that cell is blocked",
        "move_right": "move one cell east, or turn east if that cell is blocked",
        "move_up": "move one cell north, or turn north if that cell is blocked",
        "move_down": "move one cell south, or turn south if that cell is blocked",
        "do": "act on the cell you face: collect a material, drink water, hit a creature (a cow you kill is "
              "eaten), eat a ripe plant",
        "sleep": "sleep to restore energy; you wake when energy is full or when you are hurt",
    }
    if crafter_name in fixed:
        return fixed[crafter_name]
    verb, thing = crafter_name.split("_", 1)
    if verb == "place":
        rule = constants.place[thing]
        return (f"place a {_spaced(thing)} on the cell you face ({', '.join(rule['where'])}); "
                f"uses {_uses(rule['uses'])}")
    rule = constants.make[thing]
    article = "an" if thing[0] in "aeiou" else "a"
    needs = " and ".join(rule["nearby"])
    return f"make {article} {_spaced(thing)}; needs a nearby {needs}, uses {_uses(rule['uses'])}"


ACTIONS = {name: _describe(crafter_name) for name, crafter_name in CRAFTER_NAMES.items()}


def _translations() -> dict[str, str]:
    table = {}
    for name, crafter_name in CRAFTER_NAMES.items():
        table[crafter_name] = name
        table[_spaced(crafter_name)] = name
        if crafter_name.startswith("make_"):
            table["craft " + _spaced(crafter_name[5:])] = name
    for side, word in (("left", "west"), ("right", "east"), ("up", "north"), ("down", "south")):
        for near_miss in (word, side, f"go {word}", f"go {side}", f"move {word}"):
            table[near_miss] = f"Move {word.title()}"
    for near_miss in ("collect wood", "chop tree", "collect", "interact", "attack", "drink water", "eat",
                      "mine", "use"):
        table[near_miss] = "Do"
    for near_miss in ("no op", "no-op", "wait", "nothing", "do nothing"):
        table[near_miss] = "Noop"
    for thing in ("table", "furnace", "stone", "plant"):
        table[f"make {thing}"] = table[f"craft {thing}"] = table[f"place a {thing}"] = f"Place {thing.title()}"
    table["place sapling"] = "Place Plant"
    return table


def _direction(dx: int, dy: int) -> str:
    """`dx` grows to the east, `dy` to the south (crafter's map coordinates)."""
    return "-".join(word for word in ("north" if dy < 0 else "south" if dy > 0 else "",
                                      "west" if dx < 0 else "east" if dx > 0 else "") if word)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _where(dx: int, dy: int) -> str:
    text = f"{_steps(abs(dx) + abs(dy))} to your {_direction(dx, dy)}"
    if dx and dy:
        text += f" ({abs(dy)} {_direction(0, dy)}, {abs(dx)} {_direction(dx, 0)})"
    return text


def cell_name(world, pos) -> str | None:
    """What occupies a map cell: its creature or plant if any, else its material; None off the map."""
    material, obj = world[pos]
    if obj is not None:
        name = type(obj).__name__.lower()
        return "ripe plant" if name == "plant" and obj.ripe else name
    return material


class CrafterEnv:
    actions = list(ACTIONS)
    default_action = "Noop"
    translations = _translations()

    def __init__(self, max_steps: int = 10000, view: int = 9, area: int = 64):
        rows = view - math.ceil(len(constants.items) / view)   # crafter draws the inventory under the map
        if max_steps < 1 or rows < 1 or area < view:
            raise ValueError(f"need max_steps >= 1 and 3 <= view <= area, got max_steps={max_steps}, "
                             f"view={view}, area={area}")
        self.max_steps, self.view, self.area = max_steps, view, area
        self.window = (view, rows)     # visible cells (east-west, north-south), as crafter draws them
        self.unlocked: set[str] = set()
        self._env: crafter.Env | None = None
        self.shown = ""                 # the last observation

    @property
    def unwrapped(self) -> crafter.Env | None:
        """The crafter.Env of the current episode (None before the first reset)."""
        return self._env

    @property
    def instruction(self) -> Instruction:
        missing = [name for name in ACHIEVEMENTS if name not in self.unlocked]
        return Instruction(
            intro="You are an agent playing Crafter, a 2D survival game",
            mission="unlock as many achievements as you can",
            actions=dict(ACTIONS),
            tips=[
                "health, food, drink and energy range from 0 to 9; keep them up by eating (cows, ripe plants), "
                "drinking water and sleeping; when food, drink or energy is 0 you lose health",
                "you act on the cell you face; moving toward a blocked cell only turns you to face it",
                "wood comes from trees; stone and coal need a wood pickaxe, iron a stone pickaxe, diamond an "
                "iron pickaxe; tools are made next to a table (iron ones also next to a furnace)",
                "zombies come out on grass, more at night; skeletons live in dark tunnels; avoid lava",
                "achievements not yet unlocked: " + (", ".join(missing) or "none"),
            ],
        )

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._env = crafter.Env(area=(self.area, self.area), view=(self.view, self.view),
                                length=self.max_steps, seed=seed)
        self._env.reset()
        self.unlocked = set()
        self.shown = self._observation()
        return self.shown, {"achievements": []}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action not in CRAFTER_NAMES:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        _, reward, done, crafter_info = self.unwrapped.step(constants.actions.index(CRAFTER_NAMES[action]))
        self.unlocked = {name for name, count in crafter_info["achievements"].items() if count > 0}
        terminated = crafter_info["discount"] == 0   # crafter's discount is 0 exactly when the player died
        truncated = done and not terminated
        info: dict[str, Any] = {"achievements": sorted(self.unlocked), "metrics": {}}
        if terminated or truncated:
            info.update(success=len(self.unlocked) == len(ACHIEVEMENTS),
                        progress=len(self.unlocked) / len(ACHIEVEMENTS))
            info["metrics"] = {"achievements": float(len(self.unlocked)),
                               **{f"achievement/{name}": float(name in self.unlocked) for name in ACHIEVEMENTS}}
        self.shown = self._observation()
        return self.shown, float(reward), bool(terminated), bool(truncated), info

    def state_key(self) -> str:
        """What the last observation shows (the world beyond the view is not part of the key)."""
        return state_digest(self.shown)

    def visible(self) -> dict[str, tuple[int, int]]:
        """Each kind in view -> offset (dx east, dy south) of its nearest cell, nearest kinds first.

        Ties in distance go to the cell met first scanning north to south, then west to east.
        """
        world, player = self.unwrapped._world, self.unwrapped._player
        (width, height), (px, py) = self.window, player.pos
        cells = [(dx, dy) for dy in range(-(height // 2), height - height // 2)
                 for dx in range(-(width // 2), width - width // 2) if dx or dy]
        nearest: dict[str, tuple[int, int]] = {}
        for dx, dy in sorted(cells, key=lambda d: abs(d[0]) + abs(d[1])):
            name = cell_name(world, (px + dx, py + dy))
            if name is not None and name not in nearest:
                nearest[name] = (dx, dy)
        return nearest

    def _observation(self) -> str:
        env = self.unwrapped
        world, player = env._world, env._player
        seen = [f"- {name} {_where(dx, dy)}" for name, (dx, dy) in self.visible().items()]
        lines = ["You see:", *seen] if seen else ["You see nothing around you."]
        fx, fy = player.facing
        front = cell_name(world, (player.pos[0] + fx, player.pos[1] + fy)) or "the edge of the world"
        lines.append(f"You face {front} at your front ({_direction(fx, fy)}).")
        lines.append("Status: " + ", ".join(f"{name} {player.inventory[name]}" for name in STATUS) + ".")
        if player.sleeping:
            lines.append("You are sleeping.")
        if world.daylight < NIGHT_BELOW:
            lines.append("It is night.")
        items = [f"{_spaced(name)} {n}" for name, n in player.inventory.items() if name not in STATUS and n > 0]
        lines.append("Inventory: " + ", ".join(items) + "." if items else "Your inventory is empty.")
        return "\n".join(lines)
