"""BabaIsAIEnv: Baba Is You puzzles as a TextEnv, in the BabaIsAI text format.

Each observation lists the active rules, then every entity on the map except the object you
control, as an offset from it ("2 steps to the right and 1 step up"), in reading order (top to
bottom, then left to right); word blocks read as rule `word`. Offsets are from the first object
that IS YOU in reading order; an entity on its cell reads "at your position". When nothing is
you, the list is the single line "no object is you". The border is not listed.

An episode ends when a YOU object reaches a WIN object (success, reward 1 - 0.9 * steps / max_steps),
when no object IS YOU any more (failure, reward 0), or after `max_steps` moves (truncated, reward 0).
"""

from __future__ import annotations

from horizonrl.envs.base import Instruction, state_digest
from horizonrl.envs.babaisai.levels import TASKS, make_level
from horizonrl.envs.babaisai.solver import solve
from horizonrl.envs.babaisai.world import Entity, World

ACTIONS = {
    "idle": "do nothing for one turn",
    "up": "move every object that is you one cell up",
    "right": "move every object that is you one cell to the right",
    "down": "move every object that is you one cell down",
    "left": "move every object that is you one cell to the left",
}
_SYNONYMS = {"up": ("north",), "right": ("east",), "down": ("south",), "left": ("west",),
             "idle": ("wait", "stay", "noop", "no-op", "no op", "nothing", "do nothing", "pass", "rest")}
_MOVES = ("move", "go", "step", "walk", "move to the", "go to the")
TRANSLATIONS = {
    **{name: action for action, names in _SYNONYMS.items() for name in names},
    **{f"{verb} {name}": action for action in ("up", "right", "down", "left") for name in (action, *_SYNONYMS[action])
       for verb in _MOVES if not (verb.endswith("the") and action in ("up", "down"))},
}


class BabaIsAIEnv:
    actions = list(ACTIONS)
    default_action = "idle"
    translations = TRANSLATIONS

    def __init__(self, task: str, max_steps: int = 100):
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; valid: {list(TASKS)}")
        if max_steps < 1:
            raise ValueError(f"need max_steps >= 1, got {max_steps}")
        self.task, self.max_steps = task, max_steps
        self.world: World | None = None
        self.steps = 0

    @property
    def unwrapped(self) -> World | None:
        return self.world

    @property
    def instruction(self) -> Instruction:
        return Instruction(
            intro="You are an agent playing Baba Is You, a puzzle game where the rules are word blocks on the map",
            mission="win the level",
            actions=dict(ACTIONS),
            tips=["a rule is three word blocks in a line reading NOUN IS PROPERTY, left to right or top to bottom",
                  "you control every object that is you; reaching an object that is win wins the level",
                  "word blocks can be pushed: pushing a word out of line breaks its rule, pushing one into line "
                  "makes a new rule",
                  "objects that are stop block you, objects that are push get pushed, objects that are defeat "
                  "destroy you",
                  "if no object is you any more, the level is lost",
                  "offsets in the observation are counted from the object you control"],
        )

    def reset(self, seed: int) -> tuple[str, dict]:
        self.world = make_level(self.task, seed)
        self.steps = 0
        return observe(self.world), {}

    def state_key(self) -> str:
        """Every entity on the grid (which also fixes the active rules) and the active rules."""
        if self.world is None:
            raise RuntimeError("call reset(seed) before state_key")
        return state_digest(self.world.key(), tuple(sorted(map(str, self.world.rules))))

    def expert_action(self) -> tuple[str, str]:
        """(action, reason): the first move of a shortest win (the A* solver, replanned from the current
        world on every call) and its goal, e.g. ("left", "reach the key that is win")."""
        if self.world is None:
            raise RuntimeError("call reset(seed) before expert_action")
        plan = solve(self.world)
        if not plan:
            raise RuntimeError(f"no sequence of moves wins {self.task} from here")
        wins = sorted({e.name for e in self.world.entities if not e.word and "win" in self.world.properties(e)})
        return plan[0], f"reach the {' or '.join(wins)} that is win" if wins else "make a rule that wins"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        if self.world is None:
            raise RuntimeError("call reset(seed) before step")
        self.steps += 1
        rules_before = set(self.world.rules)
        if action != "idle":
            self.world.move(action)
        won, lost = self.world.won, self.world.lost
        truncated = not (won or lost) and self.steps >= self.max_steps
        info: dict = {"metrics": {"rules_changed": float(set(self.world.rules) != rules_before)}}
        if won or lost or truncated:
            info.update(success=won, progress=float(won))
        reward = 1.0 - 0.9 * self.steps / self.max_steps if won else 0.0
        observation = observe(self.world)
        if won:
            observation = "You won the level.\n" + observation
        return observation, reward, won or lost, truncated, info


def observe(world: World) -> str:
    """The BabaIsAI text for `world` (see the module docstring)."""
    lines = ["Active rules:", *(str(rule) for rule in world.rules), "Objects on the map:"]
    you = world.you
    if not you:
        return "\n".join(lines + ["no object is you"])
    me = you[0]
    others = sorted((e for e in world.entities if e is not me), key=lambda e: (e.y, e.x, not e.word, e.name))
    lines += [f"{_label(e)} {_offset(e.x - me.x, e.y - me.y)}" for e in others]
    return "\n".join(lines)


def _label(entity: Entity) -> str:
    return f"rule `{entity.name}`" if entity.word else entity.name


def _offset(dx: int, dy: int) -> str:
    def steps(n: int) -> str:
        return f"{n} step" if n == 1 else f"{n} steps"
    parts = []
    if dx:
        parts.append(f"{steps(abs(dx))} to the {'right' if dx > 0 else 'left'}")
    if dy:
        parts.append(f"{steps(abs(dy))} {'down' if dy > 0 else 'up'}")
    return " and ".join(parts) if parts else "at your position"
