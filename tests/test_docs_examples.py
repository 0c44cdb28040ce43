"""The how-to guides' Python examples run as written (docs/howto.md): the Nim game passes the
conformance check and trains a league; the toy learner kind registers, passes `check_learner` and
trains a league. Each runs in a fresh directory, as a reader would run it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOWTO = ROOT / "docs" / "howto.md"


def _section_blocks(title: str) -> list[str]:
    text = HOWTO.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end if end >= 0 else len(text)], flags=re.S)


def _python(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_add_a_game_guide_runs(tmp_path):
    game, train = _section_blocks("Add a game")
    (tmp_path / "nim.py").write_text(game)
    (tmp_path / "train_nim.py").write_text(train)
    checked = _python(tmp_path / "nim.py", tmp_path)
    assert checked.returncode == 0 and checked.stdout == "nim(heap=10) OK\n", checked.stdout + checked.stderr
    trained = _python(tmp_path / "train_nim.py", tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "run runs/nim  game nim(heap=10)  iteration 5/5" in trained.stdout, trained.stdout
    assert re.search(r"^main@0\s+snapshot\s+main\s", trained.stdout, re.M), trained.stdout


def test_the_add_a_learner_guide_runs(tmp_path):
    blocks = _section_blocks("Add a learner")
    example = blocks[-1]
    assert 'sys.path.insert(0, "tests")' in example
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "toy_learner.py", tmp_path / "tests" / "toy_learner.py")
    (tmp_path / "example.py").write_text(example)
    result = _python(tmp_path / "example.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "learner='toy_reinforce'" in result.stdout, result.stdout
    assert "run runs/toy  game tic_tac_toe  iteration 3/3" in result.stdout, result.stdout
