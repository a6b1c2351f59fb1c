"""The measures issue 62 (the renovation) is judged by, for the working tree and, with --base, a git revision:

    python benchmarks/renovation_measures.py --base 1aa68af       # before (that revision) and after (this tree)
    python benchmarks/renovation_measures.py --no-trace           # the static counts only (seconds, not a minute)

- `name_compares`: `x.algorithm == "ppo"`-style compares of an algorithm or engine name with a string, outside
  the registries (algos/registry.py, engines/registry.py); each is a decision a registry row should make;
- `key_presence`: `"logp_old" in mb`-style tests of whether a batch holds a field (BATCH_FIELDS): behaviour
  chosen by which keys a dict has;
- `optional_fields`: `mb.logp_ref is not None`-style tests of a typed batch's optional field (samples/tensors.py
  Rows, whose comment says when the field is None): what the key tests became;
- `module_settings`: `setattr(...)` calls in the package, each an attribute set on an object at run time that no
  signature shows (the shared prefix's switch was one; FSDP2's registered forward method is the one left);
- `long_functions`: functions (methods included) over 50 lines;
- `long_lines`: source lines over 110 characters;
- `ruff`: what `ruff check` (the pyproject's rules, from the working tree) finds in src/, tests/ and benchmarks/;
- `ppo_iteration`: the horizonrl functions and files a PPO iteration of the default job enters, from its start
  to its first optimizer step (iteration 1, no critic warmup), traced with sys.setprofile in a child process.

Prints one JSON object {"<tree>": {measure: value}}; `--list` adds the sites behind the counts.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRIES = ("algos/registry.py", "engines/registry.py")
NAMES = {"algorithm", "engine"}
BATCH_FIELDS = {"input_ids", "attention_mask", "loss_mask", "advantages", "returns", "values_old", "logp_old",
                "logp_ref", "logp_engine", "sampled_by_current"}
LONG_FUNCTION = 50
LONG_LINE = 110


def named(node: ast.expr) -> str | None:
    """'algorithm' for cfg.algorithm, s["algorithm"] and a bare `algorithm`; else None."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return None


def is_string(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and all(map(is_string, node.elts))


def name_compares(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) in NAMES for s in sides) and any(map(is_string, sides)):
                lines.append(node.lineno)
    return lines


def key_presence(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and isinstance(node.left, ast.Constant) and node.left.value in BATCH_FIELDS]


def optional_fields(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Is, ast.IsNot))
            and isinstance(node.left, ast.Attribute) and node.left.attr in BATCH_FIELDS]


def module_settings(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"]


def long_functions(tree: ast.AST) -> list[str]:
    return [f"{node.name}:{node.lineno} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONG_FUNCTION]


def static_measures(tree_root: Path) -> dict:
    package = tree_root / "src" / "horizonrl"
    sites = {"name_compares": [], "key_presence": [], "optional_fields": [], "module_settings": [],
             "long_functions": []}
    n_long_lines = 0
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        n_long_lines += sum(len(line) > LONG_LINE for line in text.splitlines())
        if relative not in REGISTRIES:
            sites["name_compares"] += [f"{relative}:{line}" for line in name_compares(tree)]
        sites["key_presence"] += [f"{relative}:{line}" for line in key_presence(tree)]
        sites["optional_fields"] += [f"{relative}:{line}" for line in optional_fields(tree)]
        sites["module_settings"] += [f"{relative}:{line}" for line in module_settings(tree)]
        sites["long_functions"] += [f"{relative}:{where}" for where in long_functions(tree)]
    return {**{key: len(value) for key, value in sites.items()}, "long_lines": n_long_lines, "sites": sites}


def ruff_findings(tree_root: Path) -> int | None:
    """`ruff check` with the working tree's configuration over the tree's code; None when ruff is absent."""
    command = [sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), "--output-format",
               "json", "--exit-zero", *(str(tree_root / part) for part in ("src", "tests", "benchmarks"))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    return len(json.loads(done.stdout))


def trace_ppo_iteration() -> None:
    """In the child process: run the default job's iteration 1 and print the functions and files it enters from
    the start of the iteration to the first optimizer step."""
    import horizonrl
    from horizonrl.cli import main

    package = str(Path(horizonrl.__file__).parent)
    functions: set[tuple[str, str]] = set()
    state = {"on": False, "done": False}

    def profile(frame, event, _arg):
        if event != "call" or state["done"]:
            return
        code = frame.f_code
        if code.co_name == "ppo_iteration" and code.co_filename.startswith(package):
            state["on"] = True
        if not state["on"]:
            return
        if code.co_filename.startswith(package):
            functions.add((Path(code.co_filename).relative_to(package).as_posix(), code.co_qualname))
        elif code.co_name == "step" and "torch/optim" in code.co_filename:
            state["done"] = True

    with tempfile.TemporaryDirectory() as out:
        sys.setprofile(profile)
        try:
            main(["train", "iterations=1", "critic.warmup_batches=0", "threads=1", f"output_dir={out}",
                  "save_every=1000", "report_to=[]"])
        finally:
            sys.setprofile(None)
    files = sorted({file for file, _ in functions})
    print(json.dumps({"functions": len(functions), "files": len(files), "file_list": files}))


def traced(tree_root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree_root / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, __file__, "--trace-child"], cwd=tree_root, env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{tree_root}: the traced PPO iteration exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measures(tree_root: Path, trace: bool, listing: bool) -> dict:
    result = static_measures(tree_root)
    sites = result.pop("sites")
    result["ruff"] = ruff_findings(tree_root)
    if trace:
        ppo = traced(tree_root)
        result["ppo_iteration"] = {"functions": ppo["functions"], "files": ppo["files"]}
        sites["ppo_iteration_files"] = ppo["file_list"]
    if listing:
        result["sites"] = sites
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=None, help="a git revision to measure beside the working tree")
    parser.add_argument("--no-trace", action="store_true", help="skip the traced PPO iteration")
    parser.add_argument("--list", action="store_true", help="print the sites behind each count")
    parser.add_argument("--trace-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trace_child:
        trace_ppo_iteration()
        return
    result = {}
    if args.base is not None:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "base"
            subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), args.base], cwd=ROOT, check=True,
                           capture_output=True)
            try:
                result[args.base] = measures(tree, not args.no_trace, args.list)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    result["working tree"] = measures(ROOT, not args.no_trace, args.list)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
