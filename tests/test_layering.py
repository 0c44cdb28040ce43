"""The packages' arrows point one way: games <- agents <- league <- {arena, evaluation} <- ludus.cli.

The families keep their folders at the repository root and install as `ludus.<folder>`
(pyproject.toml `package-dir`): games/ is `ludus.games`, and so on. A module may import its own
family and any lower layer, never a higher one, and the two top families (arena, evaluation) do not
import each other. The shared `ludus` modules (errors, text, charts, ...) sit below everything except
`ludus.cli` and `ludus.__main__`, which sit above everything. Every import counts, including the
ones inside functions: a lazy import is still an arrow. An import of a family by its folder's name
(`import games.core`) is an error too: installed, only `ludus` is importable at top level.

The project's modules also form no import cycle, not even through a lazy import inside a function.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("games", "agents", "league", "arena", "evaluation")
"""The root folders installed as `ludus.<folder>`."""
LAYER = {"ludus": 0, "games": 1, "agents": 2, "league": 3, "arena": 4, "evaluation": 4}
TOP = ("ludus.cli", "ludus.__main__")


def family_of(module: str) -> str | None:
    """'games' for ludus.games.x, 'ludus' for ludus.text, None for anything not ours."""
    parts = module.split(".")
    if parts[0] != "ludus":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FAMILIES else "ludus"


def layer_of(module: str) -> int | None:
    if module in TOP:
        return 9
    family = family_of(module)
    return None if family is None else LAYER[family]


def project_modules(root: Path) -> dict[str, Path]:
    """Every module of the project by its installed name: games/adapters/spiel.py is ludus.games.adapters.spiel."""
    modules = {}
    for folder in ("ludus", *FAMILIES):
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            modules[".".join(parts if folder == "ludus" else ("ludus", *parts))] = path
    return modules


def imported_modules(tree: ast.AST, names: bool = False) -> list[tuple[int, str]]:
    """(line, module) for each import; `names`: also `a.b` for every `from a import b` (b may be a module)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from ludus import cli` names the module ludus.cli
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                      if names or f"{node.module}.{alias.name}" in TOP]
    return found


def violations(root: Path) -> list[str]:
    out = []
    for module, path in project_modules(root).items():
        mine = layer_of(module)
        for line, target in imported_modules(ast.parse(path.read_text(), str(path))):
            if target.split(".")[0] in FAMILIES:
                out.append(f"{path.relative_to(root)}:{line}: {module} imports {target} (installed: ludus.{target})")
                continue
            theirs = layer_of(target)
            if theirs is None or family_of(target) == family_of(module) and mine != 9 and theirs != 9:
                continue
            if theirs > mine or (theirs == mine and theirs == 4):
                out.append(f"{path.relative_to(root)}:{line}: {module} imports {target}")
    return out


def import_cycles(root: Path) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module in the graph of imports among the
    project's modules (module-level, function-level and TYPE_CHECKING imports alike), each sorted."""
    modules = project_modules(root)

    def resolve(name: str) -> str | None:  # the longest prefix that is one of ours
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(t) for _, t in imported_modules(ast.parse(path.read_text(), str(path)), names=True)}
        graph[module] = {t for t in targets if t and t != module}
    # Tarjan (1972), iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def test_lower_packages_never_import_higher_ones():
    assert violations(ROOT) == []


def test_the_check_catches_a_planted_violation(tmp_path):
    (tmp_path / "games").mkdir()
    (tmp_path / "games" / "fine.py").write_text("import numpy\nfrom ludus.games import core\nfrom ludus.errors import UserError\n")
    (tmp_path / "games" / "bad.py").write_text("def f():\n    from ludus.league.manager import League\n")
    (tmp_path / "games" / "old.py").write_text("from games.core import GameSpec\n")
    (tmp_path / "arena").mkdir()
    (tmp_path / "arena" / "side.py").write_text("import ludus.evaluation.report\n")
    (tmp_path / "ludus").mkdir()
    (tmp_path / "ludus" / "text.py").write_text("from ludus import cli\n")
    assert violations(tmp_path) == [
        "ludus/text.py:1: ludus.text imports ludus.cli",
        "games/bad.py:2: ludus.games.bad imports ludus.league.manager",
        "games/old.py:1: ludus.games.old imports games.core (installed: ludus.games.core)",
        "arena/side.py:1: ludus.arena.side imports ludus.evaluation.report",
    ]


def test_no_import_cycle():
    assert import_cycles(ROOT) == set()


def test_the_check_catches_a_planted_cycle(tmp_path):
    (tmp_path / "ludus").mkdir()
    (tmp_path / "ludus" / "errors.py").write_text("")
    (tmp_path / "games" / "adapters").mkdir(parents=True)
    (tmp_path / "games" / "__init__.py").write_text("")
    (tmp_path / "games" / "adapters" / "__init__.py").write_text("")
    (tmp_path / "games" / "core.py").write_text("from ludus.errors import GameError\n")
    (tmp_path / "games" / "registry.py").write_text("from ludus.games import core\n"
                                                    "def build():\n    from ludus.games.adapters import spiel\n")
    (tmp_path / "games" / "adapters" / "spiel.py").write_text("from ludus.games.registry import build\n")
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "a.py").write_text("import ludus.agents.b\n")
    (tmp_path / "agents" / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                              "if TYPE_CHECKING:\n    from ludus.agents.a import A\n")
    # three modules round, the arrow back inside a method (a lazy import is still an arrow)
    (tmp_path / "arena").mkdir()
    (tmp_path / "arena" / "match.py").write_text("from ludus.arena.submission import Submission\n")
    (tmp_path / "arena" / "submission.py").write_text("from ludus.arena import store\n")
    (tmp_path / "arena" / "store.py").write_text("class Entrant:\n    def player(self):\n"
                                                 "        from ludus.arena.match import make_player\n")
    assert import_cycles(tmp_path) == {("ludus.games.adapters.spiel", "ludus.games.registry"),
                                       ("ludus.agents.a", "ludus.agents.b"),
                                       ("ludus.arena.match", "ludus.arena.store", "ludus.arena.submission")}


def test_every_package_is_installed_from_its_folder():
    """pyproject.toml lists every package (a folder with __init__.py) and maps each to its folder."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {p.parent.relative_to(ROOT).as_posix() for folder in ("ludus", *FAMILIES)
               for p in (ROOT / folder).rglob("__init__.py")}
    expected = {(f if f.startswith("ludus") else "ludus/" + f).replace("/", "."): f for f in folders}
    assert sorted(tool["packages"]) == sorted(expected)
    assert tool["package-dir"] == expected
