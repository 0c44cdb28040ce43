"""docs/config.md is generated from the config dataclasses' docstrings (scripts/config_reference.py):
the committed file must be what the generator writes now, and must name every key."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ludus.league.config import LeagueConfig
from ludus.league.configio import describe

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_config_reference_is_up_to_date():
    text = (ROOT / "docs" / "config.md").read_text()
    assert text == _generator().render(), "docs/config.md is out of date: run python3 scripts/config_reference.py"


def test_config_reference_names_every_key_with_its_doc():
    text = _generator().render()
    for key, value, doc in describe(LeagueConfig):
        if value == "" or key == "roles":
            continue  # section headings and the roles list itself
        shown = key.replace("roles.main.", "roles.NAME.", 1)
        assert f"- `{shown}` = " in text, key
        assert doc, f"config key {key} has no docstring"


def test_check_mode_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "config.md"
    stale.write_text("# Config reference\n")
    assert _generator().main(["--check", "--out", str(stale)]) == 1
    assert _generator().main(["--out", str(stale)]) == 0
    assert _generator().main(["--check", "--out", str(stale)]) == 0
