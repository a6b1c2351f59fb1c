"""TextWorld: generated text adventure games (Côté et al., 2018) as a TextEnv.

`kind` picks one of TextWorld's challenges, generated from the seed at reset:

    simple           a small house: fetch an object (open a container, unlock and open a door) and put it
                     somewhere; the score rises with every step of the quest (dense reward)
    coin_collector   walk along a chain of rooms to the coin and take it (level 5: 5 rooms)
    treasure_hunter  walk to the named object and take it (level 5: 5 rooms without doors, 3 commands)
    cooking          read the cookbook, take the one ingredient, prepare the meal and eat it (one room)

The settings of each kind are in SETTINGS; `settings` overrides them (e.g. {"level": 15}).

Generating a game takes 1 to 10 s (sampling the quest, then compiling it with Inform 7), so each game
is built once and kept in `game_dir` (default `$XDG_CACHE_HOME/horizonrl/textworld`, else
`~/.cache/horizonrl/textworld`) under a name made of the kind, its settings and the seed; later resets
with that seed load it in milliseconds.
A game is written under a temporary name and moved into place, so processes sharing `game_dir` never
see half a game.

Commands are free text, so this env deviates from the protocol's fixed action list: `actions` is the
list of commands the game accepts right now (TextWorld's admissible commands), refreshed after every
step, and `step` passes any string to the game. The agent only executes text that matches
`env.actions`, so in practice a command outside the list counts as invalid and `default_action` runs.
`default_action` is "look": it is admissible in every state of every challenge and changes nothing,
whereas "help" is not one of TextWorld's admissible commands.

Reward is the change in the game's score; progress is score / max_score and success is winning. The
episode is terminated when the game is won or lost and truncated after `max_steps` steps.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from horizonrl.envs.base import Instruction, state_digest

SETTINGS = {
    "simple": {"rewards": "dense", "goal": "detailed", "test": False},
    "coin_collector": {"level": 5},
    "treasure_hunter": {"level": 5},
    "cooking": {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False, "drop": False,
                "recipe_seed": 0, "split": "train"},
}
MISSING = "TextWorld envs need the textworld package: pip install 'horizonrl[textworld]'"
BANNER_LINE = re.compile(r"^[\s_|\\/$<>]*$")   # the ASCII-art title is drawn with these characters only
END_PROMPT = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"


@contextmanager
def _quiet():
    """Silence jericho's warning that it cannot track score on TextWorld games (TextWorld tracks it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is not fully supported")
        yield


def _textworld():
    try:
        import textworld
        import textworld.challenges
    except ImportError as error:
        raise ImportError(MISSING) from error
    return textworld


def default_game_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "horizonrl" / "textworld"


def clean(feedback: str, objective: str = "") -> str:
    """The game's text without its title art, the objective (the mission says it), the prompt line that
    ends every reply (">" then the status bar: room, score/moves) and the end-of-game menu."""
    text = feedback.replace(END_PROMPT, "")
    if objective:
        text = text.replace(objective, "")
    lines = [line.strip() for line in text.split("\n") if not line.startswith(">")]
    if any("$$" in line for line in lines):   # the title art comes only with the first observation
        lines = [line for line in lines if not BANNER_LINE.match(line) or not line]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


class TextWorldEnv:
    default_action = "look"
    translations = {"look around": "look", "l": "look", "i": "inventory", "inv": "inventory",
                    "check inventory": "inventory", "n": "go north", "s": "go south", "e": "go east",
                    "w": "go west", "north": "go north", "south": "go south", "east": "go east",
                    "west": "go west"}

    def __init__(self, kind: str = "simple", max_steps: int = 80, game_dir: str | os.PathLike | None = None,
                 settings: dict[str, Any] | None = None):
        self._tw = _textworld()
        if kind not in SETTINGS:
            raise ValueError(f"unknown TextWorld kind {kind!r}; known: {', '.join(SETTINGS)}")
        self.kind = kind
        self.settings = {**SETTINGS[kind], **(settings or {})}
        self.game_dir = Path(game_dir) if game_dir is not None else default_game_dir()
        self.walkthrough: list[str] = []   # a winning command sequence from the start, for tests and debugging
        self._before_the_first_game(max_steps)

    def _before_the_first_game(self, max_steps: int) -> None:
        """The play state before any reset (shared with ALFWorld), after checking `max_steps`."""
        if max_steps < 1:
            raise ValueError(f"need max_steps >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.actions: list[str] = [self.default_action]
        self.objective = ""
        self.score, self.max_score, self.steps = 0, 1, 0
        self._env = None
        self.shown = ""                 # the last observation

    @property
    def unwrapped(self):
        """The textworld Environment playing the current game (None before the first reset)."""
        return self._env

    @property
    def instruction(self) -> Instruction:
        return Instruction(
            intro="You are an agent playing a text adventure game",
            mission=f"win the game. Its objective: {self.objective.rstrip('.!')}" if self.objective else "win the game",
            actions={command: "" for command in self.actions},
            tips=["the listed actions are the commands the game understands right now; they change as you play",
                  "'look' describes where you are and 'inventory' lists what you carry",
                  f"your score is {self.score} out of {self.max_score}"],
        )

    def game_file(self, seed: int) -> Path:
        """The compiled game for `seed`, generated and cached on first use."""
        tag = "-".join(f"{key}{value}" for key, value in sorted(self.settings.items()))
        path = self.game_dir / f"{self.kind}-{tag}-seed{seed}.z8"
        if not (path.exists() and path.with_suffix(".json").exists()):
            self._generate(seed, path)
        return path

    def _generate(self, seed: int, path: Path) -> None:
        tw = self._tw
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".generating-", dir=path.parent))
        try:
            options = tw.GameOptions()
            options.seeds = seed % 2**32    # TextWorld takes 32-bit seeds; the collector's can be larger
            options.path = str(scratch / "game.z8")
            make = tw.challenges.CHALLENGES[f"tw-{self.kind}"][1]
            with _quiet():
                game = make(dict(self.settings), options)
                built = Path(tw.generator.compile_game(game, options))
            os.replace(built.with_suffix(".json"), path.with_suffix(".json"))
            os.replace(built, path)   # last: a present .z8 means a complete game
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        tw = self._tw
        path = self.game_file(seed)
        if self._env is not None:
            self._env.close()
        wanted = tw.EnvInfos(feedback=True, objective=True, admissible_commands=True, score=True,
                             max_score=True, won=True, lost=True, extras=["walkthrough"])
        with _quiet():
            self._env = tw.start(str(path), wanted)
            state = self._env.reset()
        self.objective = (state["objective"] or "").strip()
        self.walkthrough = list(state.get("extra.walkthrough") or [])
        self.score, self.max_score, self.steps = state["score"], state["max_score"] or 1, 0
        self.actions = list(state["admissible_commands"])
        self.shown = clean(state["feedback"], self.objective)
        return self.shown, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send `action`, any text command, to the game."""
        if self._env is None:
            raise RuntimeError("call reset(seed) first")
        state, score, done = self._env.step(action)   # textworld returns the score, not its change
        reward, self.score = score - self.score, score
        self.steps += 1
        self.actions = list(state["admissible_commands"] or [self.default_action])
        terminated = bool(done or state["won"] or state["lost"])
        truncated = not terminated and self.steps >= self.max_steps
        info: dict[str, Any] = {"metrics": {}}
        if terminated or truncated:
            info.update(success=bool(state["won"]), progress=min(1.0, max(0.0, self.score / self.max_score)))
            info["metrics"] = {"score": float(self.score)}
        self.shown = clean(state["feedback"])
        return self.shown, float(reward), terminated, truncated, info

    def state_key(self) -> str:
        """What the last observation shows, the commands the game offers now, and the score."""
        return state_digest(self.shown, tuple(sorted(self.actions)), self.score)
