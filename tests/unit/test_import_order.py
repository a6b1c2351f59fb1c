"""Rooms never look upward: a room (a folder or top-level module of the package) imports only rooms
that come before it in LAYERS, lazy imports inside functions included."""

import ast
from pathlib import Path

import horizonrl

PACKAGE = Path(horizonrl.__file__).parent
LAYERS = [  # lowest first; the data flow README.md describes runs envs -> rollout -> ... -> report
    "errors", "runfolder", "records", "envs", "agents", "tools", "tasks", "algos", "samples", "engines", "config",
    "learner", "plan", "rollout", "runstate",
    "gateway", "report", "policy_table", "evaluate", "assembly", "train", "play", "cli", "__main__",
]


def room_of(path: Path, package: Path = PACKAGE) -> str:
    return path.relative_to(package).parts[0].removesuffix(".py")


def imported_rooms(path: Path) -> set[str]:
    """The horizonrl rooms `path` imports from."""
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "horizonrl" else [f"horizonrl.{a.name}" for a in node.names]
        else:
            continue
        rooms |= {name.split(".")[1] for name in names if name.startswith("horizonrl.")}
    return rooms


def upward_imports(package: Path = PACKAGE) -> list[str]:
    violations = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == package:
            continue
        room = room_of(path, package)
        for other in imported_rooms(path) - {room}:
            if LAYERS.index(other) > LAYERS.index(room):
                violations.append(f"{path.relative_to(package)} imports {other} (above {room})")
    return violations


def test_every_room_is_in_the_layer_order():
    rooms = {room_of(path) for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE or path.name != "__init__.py"}
    assert rooms <= set(LAYERS), sorted(rooms - set(LAYERS))


def test_no_room_imports_a_room_above_it():
    assert upward_imports() == []


def test_an_upward_import_is_caught(tmp_path):
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "bad.py").write_text("def f():\n    from horizonrl.rollout.fixed_turn import X\n")
    (tmp_path / "learner" / "fine.py").write_text("from horizonrl.config import TrainConfig\nimport torch\n")
    assert upward_imports(tmp_path) == ["learner/bad.py imports rollout (above learner)"]
