"""The package's layout: no import cycles, a torch-free core, one path per module."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import lengthwise
import lengthwise.hf
import lengthwise.planning
import lengthwise.pytorch

SRC = Path(lengthwise.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every ``lengthwise`` module imported anywhere in ``tree`` (functions included),
    except under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lengthwise"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("lengthwise"):
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (names that are not modules dropped)."""
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deps = _imports(tree, name, path.name == "__init__.py")
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = dfs(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 50
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_and_relative_imports_count():
    tree = ast.parse("def f():\n    from lengthwise.planning import edges\n"
                     "from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    import lengthwise.doctor\n")
    assert _imports(tree, "lengthwise.x", False) == {"lengthwise.planning",
                                                      "lengthwise.planning.edges"}


def test_planning_imports_nothing_outside_itself():
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("lengthwise.planning"):
            outside = {d for d in deps if not d.startswith("lengthwise.planning")}
            # lengthwise.errors (the error family) and lengthwise.atomic (atomic file writes)
            # are standard-library modules with no dependency of their own
            assert outside <= {"lengthwise", "lengthwise._lazy", "lengthwise.errors",
                               "lengthwise.atomic"}, (name, outside)


def test_the_library_does_not_import_its_demo():
    """Only the demo and its command import ``lengthwise.demo``; the loop is a library part."""
    graph = import_graph()
    allowed = ("lengthwise.demo", "lengthwise.cli.demo")
    for name, deps in graph.items():
        if name == allowed[0] or name.startswith(allowed[0] + ".") or name == allowed[1]:
            continue
        demo = {d for d in deps if d == "lengthwise.demo" or d.startswith("lengthwise.demo.")}
        assert not demo, (name, demo)

def test_the_core_plans_without_importing_torch():
    code = ("import sys, lengthwise.planning as p; "
            "p.plan_epoch([3, 1, 2], p.PlanConfig(batch_size=2)); "
            "p.plan_epoch([3, 1, 2], p.PlanConfig(max_tokens=4, layout='pack')); "
            "p.optimal_edges([3, 1, 2], 2); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_commands_help_builds_without_torch():
    """``lengthwise --help`` and each command's help read their defaults from torch-free
    config classes: building the whole parser imports neither torch nor transformers."""
    code = ("import sys; from lengthwise.cli import build_parser; build_parser(); "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_top_level_help_lists_the_commands_without_importing_them():
    """``lengthwise --help`` shows what the full parser shows, from each command's ``HELP``;
    no command's options are built, so neither NumPy nor the planner is imported."""
    from lengthwise.cli import build_parser

    assert build_parser(listed=True).format_help() == build_parser().format_help()
    code = ("import sys\nfrom lengthwise.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m in ('numpy', 'torch', 'pyarrow') "
            "or m.startswith('lengthwise.planning.') and m != 'lengthwise.planning.vocabulary'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


#: module paths of an earlier layout, which this one does not have
OLD_PATHS = ("lengthwise.batching", "lengthwise.orders", "lengthwise.edges", "lengthwise.cost",
             "lengthwise.lengths", "lengthwise.metrics", "lengthwise.jsonl", "lengthwise.plan",
             "lengthwise.pack", "lengthwise.pack._lanes", "lengthwise.sampler",
             "lengthwise.collate", "lengthwise.collate.pad", "lengthwise.calibrate",
             "lengthwise.train._dist", "lengthwise.hf_lengths", "lengthwise.hf_trainer",
             "lengthwise.demo.loop", "lengthwise.demo.schedule", "lengthwise.demo.device",
             "lengthwise.pytorch.collate.held", "lengthwise.train.checkpoint.errors",
             "lengthwise.train.step_logger.shares")


@pytest.mark.parametrize("old", OLD_PATHS)
def test_an_old_module_path_is_not_importable(old):
    with pytest.raises(ModuleNotFoundError) as err:
        importlib.import_module(old)
    gone = err.value.name  # the old path, or the old package that held it
    assert old.startswith(gone) and str(err.value) == f"No module named '{gone}'"
    assert old not in sys.modules


@pytest.mark.parametrize("package", [lengthwise.planning, lengthwise.pytorch, lengthwise.hf])
def test_every_subpackage_export_resolves(package):
    for name in package._EXPORTS:
        assert getattr(package, name) is not None, name


def test_the_dflash_extra_holds_what_the_demo_command_needs():
    """``pip install lengthwise[dflash]`` then ``lengthwise demo --task dflash``: plot included."""
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]

    def names(extra):
        return {re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0] for req in extras[extra]}

    assert names("demo") <= names("dflash"), names("demo") - names("dflash")
