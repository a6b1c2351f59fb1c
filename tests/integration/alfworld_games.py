"""An ALFWorld data folder for tests: ALFWorld's game data is a GitHub download (not reachable here), so this
writes games the way `alfworld-download`'s files are made: ALFWorld's own PDDL domain and text grammar
(shipped in the alfworld package), the task line in the grammar, and a small ALFRED problem written by hand in
ALFRED's naming (a kitchen: an apple on a countertop, a closed fridge, a cabinet; goal: the apple in the fridge),
in three trial folders (GAMES): that game marked unsolvable, that game, and the kitchen without its cabinet.
The plan is 5 commands: go to countertop 1, take apple 1, go to fridge 1, open fridge 1, move apple 1 to fridge 1."""

import json
from pathlib import Path

APPLE = "Apple_bar__minus_01_dot_00_bar__plus_00_dot_90_bar__plus_01_dot_00"
COUNTER = "CounterTop_bar__minus_01_dot_00_bar__plus_00_dot_95_bar__plus_01_dot_00"
FRIDGE = "Fridge_bar__minus_02_dot_00_bar__plus_00_dot_00_bar__minus_01_dot_50"
CABINET = "Cabinet_bar__plus_02_dot_00_bar__plus_01_dot_80_bar__minus_01_dot_50"
TASK = "put some apple in fridge"
GAMES = {"look_at_obj_in_light-Apple-None-Fridge-1": (True, False),   # task folder -> (has the cabinet, solvable)
         "pick_and_place_simple-Apple-None-Fridge-1": (True, True),
         "pick_and_place_simple-Apple-None-Fridge-2": (False, True)}


def problem(cabinet: bool) -> str:
    """The kitchen's PDDL problem, with or without its cabinet."""
    cabinet_object = f"{CABINET} - receptacle" if cabinet else ""
    cabinet_facts = (f"(receptacleType {CABINET} CabinetType) (openable {CABINET})\n"
                     f"        (receptacleAtLocation {CABINET} loc_bar_8_bar__minus_6_bar_1_bar_0)") if cabinet else ""
    return f"""(define (problem plan_trial_test)
    (:domain alfred)
    (:objects
        agent1 - agent
        AppleType - otype
        CounterTopType - rtype
        FridgeType - rtype
        CabinetType - rtype
        {APPLE} - object
        {COUNTER} - receptacle
        {FRIDGE} - receptacle
        {cabinet_object}
        loc_bar_0_bar_0_bar_0_bar_30 - location
        loc_bar__minus_4_bar_4_bar_1_bar_45 - location
        loc_bar__minus_8_bar__minus_6_bar_2_bar_30 - location
        loc_bar_8_bar__minus_6_bar_1_bar_0 - location
    )
    (:init
        (atLocation agent1 loc_bar_0_bar_0_bar_0_bar_30)
        (receptacleType {COUNTER} CounterTopType)
        (receptacleAtLocation {COUNTER} loc_bar__minus_4_bar_4_bar_1_bar_45)
        (receptacleType {FRIDGE} FridgeType)
        (receptacleAtLocation {FRIDGE} loc_bar__minus_8_bar__minus_6_bar_2_bar_30)
        (openable {FRIDGE})
        {cabinet_facts}
        (objectType {APPLE} AppleType)
        (objectAtLocation {APPLE} loc_bar__minus_4_bar_4_bar_1_bar_45)
        (inReceptacle {APPLE} {COUNTER})
        (pickupable {APPLE})
        (coolable {APPLE})
        (canContain CounterTopType AppleType)
        (canContain FridgeType AppleType)
        (canContain CabinetType AppleType)
    )
    (:goal
        (exists (?r - receptacle)
            (exists (?o - object)
                (and (inReceptacle ?o ?r) (objectType ?o AppleType) (receptacleType ?r FridgeType))))
    )
)
"""


def write_games(root: Path) -> Path:
    """`root` as $ALFWORLD_DATA holds it: json_2.1.1/train/<task>/<trial>/game.tw-pddl for the three games."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    grammar = Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", TASK)
    for task_dir, (cabinet, solvable) in GAMES.items():
        trial = root / "json_2.1.1" / "train" / task_dir / "trial_T20261128_000000_000000"
        trial.mkdir(parents=True, exist_ok=True)
        game = {"pddl_domain": Path(ALFRED_PDDL_PATH).read_text(), "grammar": grammar,
                "pddl_problem": problem(cabinet), "solvable": solvable}
        (trial / "game.tw-pddl").write_text(json.dumps(game))
    return root
