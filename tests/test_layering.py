"""The packages' arrows point one way: games <- agents <- league <- {arena, evaluation} <- ludus.cli.

A module may import its own package and any lower layer, never a higher one, and the two top
packages (arena, evaluation) do not import each other. `ludus` (errors, text, charts) sits below
everything except `ludus.cli` and `ludus.__main__`, which sit above everything. Every import
counts, including the ones inside functions: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYER = {"ludus": 0, "games": 1, "agents": 2, "league": 3, "arena": 4, "evaluation": 4}
TOP = ("ludus.cli", "ludus.__main__")


def layer_of(module: str) -> int | None:
    package = module.split(".")[0]
    if module in TOP:
        return 9
    return LAYER.get(package)


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from ludus import cli` names the module ludus.cli
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                      if f"{node.module}.{alias.name}" in TOP]
    return found


def violations(root: Path) -> list[str]:
    out = []
    for package in LAYER:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            mine = layer_of(module)
            for line, target in imported_modules(ast.parse(path.read_text(), str(path))):
                theirs = layer_of(target)
                if theirs is None or target.split(".")[0] == module.split(".")[0] and mine != 9 and theirs != 9:
                    continue
                if theirs > mine or (theirs == mine and theirs == 4):
                    out.append(f"{path.relative_to(root)}:{line}: {module} imports {target}")
    return out


def test_lower_packages_never_import_higher_ones():
    assert violations(ROOT) == []


def test_the_check_catches_a_planted_violation(tmp_path):
    (tmp_path / "games").mkdir()
    (tmp_path / "games" / "fine.py").write_text("import numpy\nfrom games import core\nfrom ludus.errors import UserError\n")
    (tmp_path / "games" / "bad.py").write_text("def f():\n    from league.manager import League\n")
    (tmp_path / "arena").mkdir()
    (tmp_path / "arena" / "side.py").write_text("import evaluation.report\n")
    (tmp_path / "ludus").mkdir()
    (tmp_path / "ludus" / "text.py").write_text("from ludus import cli\n")
    assert violations(tmp_path) == [
        "ludus/text.py:1: ludus.text imports ludus.cli",
        "games/bad.py:2: games.bad imports league.manager",
        "arena/side.py:1: arena.side imports evaluation.report",
    ]
