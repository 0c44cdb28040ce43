"""The README's tour works as written: every command of its "A ten-minute tour" section runs, on a
fresh directory, and prints what the README says it prints; its Python example runs.

The commands are read from the README itself (its bash blocks), so a command added to the tour is
run here too, and one that no longer works fails this test. The checks look at structure (headers,
row names, fixed phrases), not at figures, which change from run to run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RUN = "runs/quickstart-s0"


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _commands(block: str) -> list[str]:
    """The commands of a bash block, comments removed."""
    commands = []
    for line in block.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def _header_words(block: str) -> list[str]:
    """The column names of a table shown in a text block: its line starting with 'player' or 'opponent'."""
    for line in block.splitlines():
        if line.startswith(("player ", "opponent ")):
            return [w for w in line.split() if w != "..."]
    raise AssertionError(f"no table header in\n{block}")


def _table_header(output: str, first: str) -> list[str]:
    for line in output.splitlines():
        if line.lstrip().startswith(first + " "):
            return line.split()
    raise AssertionError(f"no line starting with {first!r} in\n{output}")


def _in_order(words: list[str], header: list[str]) -> bool:
    """The README's column names appear in the printed header, in the same order (columns may be added)."""
    position = 0
    for word in words:
        if word not in header[position:]:
            return False
        position = header.index(word, position) + 1
    return True


def _ludus(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "ludus", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text()


def test_readme_opens_with_the_two_commands_and_keeps_its_limits(readme):
    first = _blocks(readme, "bash")[0]
    assert readme.index("```bash") < readme.index("\n## "), "the two commands come before any section"
    assert first.splitlines() == ["bash scripts/setup.sh && ludus train quickstart",
                                  "bash scripts/setup.sh --test && python3 -m pytest"]
    assert len(readme.splitlines()) < 300
    rows = [line for line in readme.splitlines() if line.startswith("|")]
    assert rows and max(len(row) for row in rows) <= 200
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", readme):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


# Commands that only read a run or list games run through the CLI's `main` in this process (the
# `ludus_here` fixture: the same code path, without ~3 s of interpreter start each); the rest run as
# real processes, as a reader types them.
IN_PROCESS = {"status", "ratings", "replay", "games", "matches", "arena leaderboard"}


def test_every_command_of_the_tour_prints_what_the_readme_says(readme, tmp_path, ludus_here, monkeypatch):
    tour = _section(readme, "A ten-minute tour")
    commands = [c for block in _blocks(tour, "bash") for c in _commands(block)]
    text_blocks = _blocks(tour, "text")
    # The quickstart, as the README's first block runs it: a real process in a fresh directory.
    train = _ludus(["train", "quickstart"], tmp_path)
    assert train.returncode == 0, train.stderr
    run = tmp_path / RUN
    assert (run / "ledger.sqlite").is_file() and (run / "output_policy").is_dir()
    assert f"run {RUN}  game tic_tac_toe  iteration" in train.stdout
    header = _table_header(train.stdout, "player")
    assert _in_order(_header_words(text_blocks[0]), header), \
        "the README's population table header differs from what `ludus train quickstart` prints"
    rows = {line.split()[0] for line in train.stdout.splitlines() if line.strip()}
    assert {"anchor:perfect", "anchor:random", "main", "main@0"} <= rows
    assert re.search(r"\bit \d+/\d+\b", train.stderr), "no progress line on stderr"

    assert commands, "the tour shows no commands"
    seen = set()
    for command in commands:
        words = shlex.split(command)
        assert words[0] == "ludus", command
        key = " ".join(words[1:3]) if words[1] == "arena" else words[1]
        if key in IN_PROCESS:
            with monkeypatch.context() as here:
                here.chdir(tmp_path)
                result = ludus_here(*words[1:])
        else:
            result = _ludus(words[1:], tmp_path)
        assert result.returncode == 0, f"`{command}` failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        out = result.stdout
        seen.add(key)
        if key == "status":
            assert _table_header(out, "player") == header
        elif key == "ratings":
            assert re.search(r"^\s+#\s+player\s+mu\s+sigma\s+mu-3s\s+BT\s+95% interval", out, re.M), out
        elif key == "replay":
            assert re.search(r"^match 1: recorded returns .*, replayed .*: OK$", out, re.M), out
        elif key == "resume":
            assert f"run {RUN}  game tic_tac_toe  iteration 32/32" in out, out
        elif key == "matches":
            lines = out.splitlines()
            assert lines[0].split()[:4] == ["match", "kind", "iter", "steps"], out
            assert len(lines) == 7 and all(" rating " in line for line in lines[1:6]), out
            assert f"ludus replay {RUN} ID" in lines[-1], out
        elif key == "report":
            assert (run / "report.html").is_file() and "wrote" in out
        elif key == "arena submit":
            assert re.search(r"^entered \S+ \(.*\) in the tic_tac_toe arena my_arena$", out, re.M), out
        elif key == "arena run":
            assert re.search(r"^round 1: ", out, re.M), out
            assert _table_header(out, "entrant")[:6] == ["entrant", "games", "W", "D", "L", "starts"]
            for name in ("random", "perfect", "mcts-25", "main@1"):
                assert re.search(rf"^\s+\S*{re.escape(name)}\s+\d+", out, re.M), (name, out)
            assert "0 forfeited" in out, out
        elif key == "arena leaderboard":
            assert "ranked by TrueSkill mu - 3 sigma" in out and "head-to-head" in out, out
            lines = [line.split() for line in out.splitlines()]
            ranked = [line[1] for line in lines if len(line) > 2 and line[0].isdigit() and line[1] != "."]
            assert ranked[0] in ("perfect", "mcts-25"), out  # the strong bots lead the table
        elif key == "evaluate" and "--exploitability" in words:
            assert "spiel:kuhn_poker: exploitability (NashConv / players)" in out, out
            assert re.search(r"^\s+newest snapshot\s+\d\.\d+\s+main@\d+", out, re.M), out
            assert re.search(r"^\s+best snapshot\s+\d\.\d+", out, re.M), out
        elif key == "evaluate":
            assert "(snapshot mixture, game tic_tac_toe)" in out, out
            assert _in_order(_header_words(text_blocks[1]), _table_header(out, "opponent")), out
            assert re.search(r"^main@0\s+snapshot\s+20\s", out, re.M), out
            assert re.search(r"^overall: \d+ games, score \d\.\d+ \[", out, re.M), out
            assert re.search(r"^TrueSkill placement \(opponents' ratings fixed, \d+ games\): mu ", out, re.M), out
        elif key == "train":
            assert "iteration 3/3" in out, out
        elif key == "games" and "--check" in words:
            assert re.search(r"^tic_tac_toe: OK in \d+\.\d+ s$", out, re.M), out
            assert re.search(r"^  ok  ", out, re.M), out
            assert "FAIL" not in out
        elif key == "games":
            assert out.split()[:5] == ["id", "players", "actions", "observation", "moves"], out
            assert re.search(r"^tic_tac_toe\s+2\s+9\s", out, re.M) and re.search(r"^spiel:kuhn_poker\s", out, re.M)
        else:
            raise AssertionError(f"the tour shows `{command}`, which this test does not check: add a check")
    assert {"status", "ratings", "arena run", "arena leaderboard", "evaluate", "games"} <= seen

    # Named in the tour's prose: play the trained policy yourself (moves typed on stdin).
    assert f"`ludus play tic_tac_toe --against {RUN}`" in tour
    play = _ludus(["play", "tic_tac_toe", "--against", RUN, "--seed", "3"], tmp_path,
                  stdin="".join(f"{i}\n" for i in range(9)))
    assert play.returncode == 0 and "Game over: you " in play.stdout, play.stdout[-1000:] + play.stderr


def test_the_python_example_runs(readme, tmp_path):
    example = _blocks(_section(readme, "Python"), "python")
    assert len(example) == 1
    script = tmp_path / "example.py"
    script.write_text(example[0])
    env = {**os.environ, "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.startswith("2 players, 9 actions\n"), out
    assert re.search(r"^returns \[", out, re.M) and "PettingZoo returns {'player_0': " in out, out
    assert "run runs/py  game tic_tac_toe  iteration 2/2" in out, out
    assert re.search(r"^score \d\.\d\d over \d+ games$", out, re.M), out
