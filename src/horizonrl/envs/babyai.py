"""BabyAI: minigrid's grid-world instruction levels, played through text.

Each task is one minigrid BabyAI level, kept small and local (the agent's own room) and, where the task
allows it, free of distractor objects:

    goto               BabyAI-GoToObj-v0         one object in one 8x8 room; the local level without
                                                 distractors (GoToLocal has 8 objects)
    pickup             PickupObj (below)         one object in one 8x8 room: GoToObj with a pick-up
                                                 instruction; every registered pick-up level has
                                                 distractors (PickupLoc: 8 objects, PickupDist: 5) or
                                                 several rooms
    open               BabyAI-OpenDoorColor-v0   four unlocked doors of different colours in the agent's
                                                 room, the mission names one by colour (OpenDoor may name
                                                 it by a location relative to the start pose instead;
                                                 OpenRedDoor's mission never changes)
    pick_up_seq_go_to  PickupThenGoTo (below)    two objects in one 8x8 room, "pick up X, then go to Y";
                                                 minigrid has no such level (SynthSeq spans many rooms and
                                                 mixes in other instructions)
    putnext            BabyAI-PutNextLocal-v0    eight objects in one 8x8 room, "put X next to Y"

An episode is truncated after 64 steps (goto, pickup) or 128 (the others) unless `max_steps` says
otherwise; the limit is minigrid's own `max_steps`, so both count the same steps. An episode ends
(terminated) when minigrid's verifier reports the mission done (`info["success"]` True) or failed.
`truncated` is never True together with `terminated`. The reward is 1.0 on success and 0.0 otherwise,
or minigrid's own (1 - 0.9 * steps / max_steps on success) with `binary_reward=False`.

Observation: one line per thing the agent sees in its 7x7 egocentric view (6 cells ahead, 3 to each
side, nothing behind walls or closed doors), placed relative to the agent, nearest first (Manhattan
distance), then from left to right:

    a red ball 2 steps forward
    a blue key 1 step left and 1 step forward
    a closed green door 3 steps right and 3 steps forward      (also "an open ..." and "a locked ...")
    a wall 3 steps right

Walls are reported only straight ahead, straight left and straight right, the first thing seen along
each of those lines and only if that is a wall. The last line is "You carry a grey key" while carrying
one; the carried object and the agent's own cell are never listed as seen. With nothing in view the
text is "You see nothing nearby".

minigrid prints a line to stdout for every layout it rejects while generating a level ("Sampling
rejected: unreachable object at (6, 1)"): its normal retries, not errors. `reset` keeps them off stdout.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* ids with gymnasium)
from minigrid.core.actions import Actions
from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
from minigrid.envs.babyai.core.verifier import BeforeInstr, GoToInstr, ObjDesc, PickupInstr
from minigrid.utils.baby_ai_bot import BabyAIBot

from horizonrl.envs.base import Instruction, state_digest

ACTIONS = {
    "turn left": "turn 90 degrees to the left",
    "turn right": "turn 90 degrees to the right",
    "go forward": "move one step forward",
    "pick up": "pick up the object 1 step forward",
    "drop": "put the carried object down on the empty cell 1 step forward",
    "toggle": "open or close the door 1 step forward",
}
_MINIGRID_ACTION = {"turn left": Actions.left, "turn right": Actions.right, "go forward": Actions.forward,
                    "pick up": Actions.pickup, "drop": Actions.drop, "toggle": Actions.toggle}
_ACTION_TEXT = {action: text for text, action in _MINIGRID_ACTION.items()}
# the bot's subgoal (its class name) -> the verb that says what the bot is doing
_SUBGOAL_VERB = {"GoNextToSubgoal": "go next to", "OpenSubgoal": "open", "CloseSubgoal": "close",
                 "PickupSubgoal": "pick up", "DropSubgoal": "drop", "ExploreSubgoal": "explore"}

TIPS = [
    "you see 6 steps ahead and 3 steps to each side, not behind you and not through walls or closed doors",
    "positions are relative to you, so they change whenever you move or turn",
    "you have gone to an object when it is exactly 1 step forward; pick up and toggle also act 1 step forward",
    "you can carry one object at a time; drop puts it on the cell 1 step forward, which must be empty",
    "two objects are next to each other when one is 1 step left, right, forward or behind the other",
    "going forward into a wall, a closed door or an object does nothing",
    "toggling a box opens it and the box disappears",
]


class PickupObj(RoomGridLevel):
    """One room (8x8 with its walls), the agent and one random object; the mission is to pick it up."""

    def __init__(self, room_size: int = 8, **kwargs):
        super().__init__(num_rows=1, num_cols=1, room_size=room_size, **kwargs)

    def gen_mission(self):
        self.place_agent()
        target = self.add_distractors(num_distractors=1)[0]
        self.instrs = PickupInstr(ObjDesc(target.type, target.color))


class PickupThenGoTo(RoomGridLevel):
    """One room (8x8 with its walls), the agent and two different objects X and Y; the mission is
    "pick up X, then go to Y". Two objects cannot wall the agent in, as whichever is adjacent can be
    picked up, so no reachability check (and no rejection sampling) is needed."""

    def __init__(self, room_size: int = 8, **kwargs):
        super().__init__(num_rows=1, num_cols=1, room_size=room_size, **kwargs)

    def gen_mission(self):
        self.place_agent()
        first, second = self.add_distractors(num_distractors=2, all_unique=True)
        self.instrs = BeforeInstr(PickupInstr(ObjDesc(first.type, first.color)),
                                  GoToInstr(ObjDesc(second.type, second.color)))


# task -> (registered level id or level class, default step limit, mission shown before the first reset)
LEVELS: dict[str, tuple[str | type[RoomGridLevel], int, str]] = {
    "goto": ("BabyAI-GoToObj-v0", 64, "go to the object named after reset"),
    "pickup": (PickupObj, 64, "pick up the object named after reset"),
    "open": ("BabyAI-OpenDoorColor-v0", 128, "open the door named after reset"),
    "pick_up_seq_go_to": (PickupThenGoTo, 128, "pick up one object, then go to another, named after reset"),
    "putnext": ("BabyAI-PutNextLocal-v0", 128, "put one object next to another, named after reset"),
}

VIEW = 7                          # minigrid's default agent_view_size, which the BabyAI levels keep
AGENT = (VIEW // 2, VIEW - 1)     # the agent's cell in the view grid, facing towards row 0


class BabyAIEnv:
    actions = list(ACTIONS)
    default_action = "go forward"
    translations = {
        "forward": "go forward", "move forward": "go forward", "go straight": "go forward",
        "walk forward": "go forward", "step forward": "go forward", "move ahead": "go forward",
        "left": "turn left", "turn to the left": "turn left", "rotate left": "turn left",
        "right": "turn right", "turn to the right": "turn right", "rotate right": "turn right",
        "pickup": "pick up", "pick-up": "pick up", "pick up object": "pick up", "pick up the object": "pick up",
        "drop object": "drop", "drop the object": "drop", "put down": "drop",
        "open": "toggle", "open door": "toggle", "open the door": "toggle",
        "close": "toggle", "close door": "toggle", "close the door": "toggle",
    }

    def __init__(self, task: str, max_steps: int | None = None, binary_reward: bool = True):
        if task not in LEVELS:
            raise ValueError(f"unknown BabyAI task {task!r}; tasks: {', '.join(LEVELS)}")
        level, default_steps, self._placeholder = LEVELS[task]
        self.max_steps = default_steps if max_steps is None else max_steps
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.task, self.binary_reward = task, binary_reward
        if isinstance(level, str):
            self.level = level
            self._env = gym.make(level, max_steps=self.max_steps, disable_env_checker=True).unwrapped
        else:
            self.level = level.__name__
            self._env = level(max_steps=self.max_steps)
        self._mission: str | None = None
        self._bot: BabyAIBot | None = None
        self._suggested: int | None = None   # the bot's last action, and the action the env last took
        self._taken: int | None = None

    @property
    def unwrapped(self) -> Any:
        return self._env

    @property
    def instruction(self) -> Instruction:
        return Instruction(
            intro="You are an agent playing a simple navigation game",
            mission=self._mission or self._placeholder,
            actions=dict(ACTIONS),
            tips=list(TIPS),
        )

    def reset(self, seed: int) -> tuple[str, dict]:
        with contextlib.redirect_stdout(io.StringIO()):   # minigrid's "Sampling rejected: ..." retries
            self._env.reset(seed=seed)
        self._mission = self._env.mission
        self._bot = self._suggested = self._taken = None
        return describe(self._env), {"mission": self._mission}

    def state_key(self) -> str:
        """The agent's cell, direction and carried object, and every cell of the grid (doors open or not)."""
        env = self._env
        carrying = env.carrying.encode() if env.carrying is not None else None
        return state_digest(tuple(int(x) for x in env.agent_pos), int(env.agent_dir), carrying,
                            env.grid.encode().tobytes())

    def expert_recovers_from(self) -> list[str]:
        """What a noisy demonstration (sft.expert_noise) may take instead of the bot's action: the bot replans
        from any move or turn, but a box toggled open is gone for good (minigrid's bot gives up on it)."""
        return ["turn left", "turn right", "go forward"]

    def expert_action(self) -> tuple[str, str]:
        """(action, reason): the next action of minigrid's BabyAI bot, which plans from the full grid
        state, and what it is doing, e.g. ("go forward", "go next to the red box"). Call it once per
        step: the bot keeps its plan between calls (it restarts on reset). A step that took another action
        than the bot's is told to the bot (its advising mode), which replans from there."""
        deviation = self._taken if self._bot is not None and self._taken != self._suggested else None
        if self._bot is None:
            self._bot = BabyAIBot(self._env)
        action = self._suggested = self._bot.replan(deviation)
        if action not in _ACTION_TEXT:
            raise RuntimeError(f"the BabyAI bot chose {action!r}, which this env does not offer")
        subgoal = self._bot.stack[-1] if self._bot.stack else None
        verb = _SUBGOAL_VERB.get(type(subgoal).__name__, "finish the mission")
        target = subgoal.datum.surface(self._env) if isinstance(getattr(subgoal, "datum", None), ObjDesc) else ""
        return _ACTION_TEXT[action], f"{verb} {target}".strip()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        self._taken = _MINIGRID_ACTION[action]
        _, reward, terminated, truncated, _ = self._env.step(self._taken)
        success = bool(terminated and reward > 0)   # minigrid's success reward is >= 0.1; failure gives 0
        truncated = bool(truncated and not terminated)
        info: dict[str, Any] = {"metrics": {}}
        if terminated or truncated:
            info.update(success=success, progress=float(success))
        if self.binary_reward:
            reward = float(success)
        return describe(self._env), float(reward), bool(terminated), truncated, info


def describe(env) -> str:
    """The observation text for a minigrid env's current state (see the module docstring)."""
    grid, visible = env.gen_obs_grid()
    seen = []  # (distance, right, forward, line)

    def add(i: int, j: int, thing: str) -> None:
        right, forward = i - AGENT[0], AGENT[1] - j
        seen.append((abs(right) + forward, right, forward, f"{thing} {_where(right, forward)}"))

    for j in range(VIEW):
        for i in range(VIEW):
            cell = grid.get(i, j)
            if cell is not None and cell.type != "wall" and visible[i, j] and (i, j) != AGENT:
                add(i, j, _name(cell))
    for di, dj in ((0, -1), (-1, 0), (1, 0)):   # straight ahead, left, right
        i, j = AGENT[0] + di, AGENT[1] + dj
        while 0 <= i < VIEW and 0 <= j < VIEW and visible[i, j]:
            cell = grid.get(i, j)
            if cell is not None:
                if cell.type == "wall":
                    add(i, j, "a wall")
                break
            i, j = i + di, j + dj
    lines = [line for *_, line in sorted(seen)] or ["You see nothing nearby"]
    if env.carrying is not None:
        lines.append(f"You carry {_name(env.carrying)}")
    return "\n".join(lines)


def _name(obj) -> str:
    """'a red ball', 'an open yellow door', 'a locked blue door'."""
    words = f"{obj.color} {obj.type}"
    if obj.type == "door":
        state = "open" if obj.is_open else "locked" if obj.is_locked else "closed"
        words = f"{state} {words}"
    return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _where(right: int, forward: int) -> str:
    """'2 steps forward', '1 step left', '1 step right and 3 steps forward'."""
    def steps(n: int, way: str) -> str:
        return f"{n} step{'' if n == 1 else 's'} {way}"
    parts = []
    if right:
        parts.append(steps(abs(right), "left" if right < 0 else "right"))
    if forward:
        parts.append(steps(forward, "forward"))
    return " and ".join(parts)
