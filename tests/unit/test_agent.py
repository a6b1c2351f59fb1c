import os

import pytest

from horizonrl.agents.actions import decide, normalise
from horizonrl.agents.prompt import RESPONSE_FORMAT, HistoryEntry, build_messages, plan_text, system_prompt
from horizonrl.envs.base import Instruction

ACTIONS = ["go left", "go right", "stay"]


@pytest.mark.parametrize("text,action,valid", [
    ("THINK: go left is bad\nACTION: go right", "go right", True),
    ("THINK: x\nACTION: Go Right.", "go right", True),
    ("THINK: x\nACTION:   \"stay\"  \nmore text", "stay", True),
    ("THINK: ACTION: go left then\nACTION: go right", "go right", True),   # the last ACTION: wins
    ("THINK: x\nACTION: fly", "stay", False),
    ("THINK: no action at all", "stay", False),
    ("", "stay", False),
])
def test_decide(text, action, valid):
    decision = decide(text, ACTIONS, "stay")
    assert (decision.action, decision.valid) == (action, valid)


def test_decide_keeps_reasoning_and_raw_text():
    decision = decide("THINK: the goal is right\nACTION: jump", ACTIONS, "stay")
    assert decision.think == "the goal is right" and decision.raw_action == "jump"
    assert plan_text(decision.think, decision.action) == "THINK: the goal is right\nACTION: stay"


def test_translations_map_near_misses():
    decision = decide("ACTION: move right", ACTIONS, "stay", {"move right": "go right"})
    assert decision.action == "go right" and decision.valid


def test_normalise():
    assert normalise("  `Go   LEFT`!  \n second line") == "go left"


def test_memory_window():
    history = [HistoryEntry(f"obs{i}", f"plan{i}") for i in range(3)]
    messages = build_messages("SYS", history, "now", memory=2)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == "Observation:\nobs1"
    assert messages[2]["content"] == "Previous plan:\nplan1"
    assert messages[4]["content"] == "Previous plan:\nplan2"
    assert messages[-1]["content"] == f"Current Observation:\nnow\n\n{RESPONSE_FORMAT}"
    assert len(build_messages("SYS", history, "now", memory=0)) == 2
    assert len(build_messages("SYS", history[:1], "now", memory=5)) == 4


def test_system_prompt_lists_mission_actions_and_tips():
    text = system_prompt(Instruction("You are a test agent", "win", {"a": "do a", "b": "do b"}, ["tip one"]))
    assert text.startswith("You are a test agent.\nThe following are the possible actions")
    assert "a: do a, b: do b." in text and "Tips: tip one." in text and text.endswith("Your goal is to win.\nPLAY!")


def test_system_prompts_of_two_missions_share_all_but_the_mission():
    """The mission comes last, so episodes with different missions share the rest as a token prefix."""
    goto, pickup = (system_prompt(Instruction("You are a test agent", mission, {"a": "do a"}, ["tip one"]))
                    for mission in ("go to the red ball", "pick up the key"))
    assert os.path.commonprefix([goto, pickup]) == goto.removesuffix("go to the red ball.\nPLAY!")
