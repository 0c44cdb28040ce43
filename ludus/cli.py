"""The `ludus` command line: a thin shell over the Python API of each package.

Each package contributes its subcommands through `<package>/cli.py:register(subparsers)`;
those modules import nothing heavy at import time, so `ludus --help` stays fast.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sqlite3
import sys
from pathlib import Path

from ludus import __version__
from ludus.errors import UserError
from ludus.text import printable

# Packages that add subcommands, in the order `ludus --help` lists them.
COMMAND_MODULES = ("ludus.games.cli", "ludus.agents.cli", "ludus.league.cli", "ludus.arena.cli", "ludus.evaluation.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ludus", description="Ludus: multi-agent self-play league, arena and evaluation.")
    parser.add_argument("--version", action="version", version=f"ludus {__version__}")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first, e.g. one whose games.registry.register calls add games "
                             "(repeatable; also $LUDUS_IMPORT, comma-separated). A run's own game_module is "
                             "imported by itself")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that package has no commands yet
                continue
            raise
        module.register(sub)
    # The league does not import evaluation (the layers point one way); the CLI, above both,
    # hands a run the measurements evaluation attaches to it.
    parser.set_defaults(league_hooks=_league_hooks)
    return parser


def _league_hooks(config):
    from ludus.evaluation.league_hooks import league_hooks

    return league_hooks(config)


def _check_match_argument(args) -> None:
    """`ludus replay RUN ID` and `ludus arena replay ID`: refuse an id no ledger can hold before any
    command looks it up (sqlite3 would raise OverflowError past 64 bits: a traceback)."""
    match = getattr(args, "match", None)
    if isinstance(match, int):
        from ludus.league.records.replay import check_match_id

        check_match_id(match)


RUN_PATH_ARGUMENTS = ("run_dir", "checkpoint", "snapshot", "against", "config")
"""Arguments that may name a run, or a snapshot or output policy inside one (its config.json is
beside them or two levels up): the run's `game_module` is imported before the command runs."""


def _import_games(args) -> list[str]:
    """Import the modules of --import and $LUDUS_IMPORT, and the `game_module` of each run an
    argument names, so games registered in Python (`ludus.games.registry.register`) are known.
    A run's module that cannot be imported is no error yet (`ludus status` needs no game): the
    reasons are returned, and said if the command then meets an unknown game."""
    from ludus.league.config import import_game_module

    modules = [m.strip() for m in os.environ.get("LUDUS_IMPORT", "").split(",") if m.strip()] + args.imports
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UserError(f"--import {module}: cannot import it ({exc}); put it on PYTHONPATH") from None
    problems = []
    for name in RUN_PATH_ARGUMENTS:
        value = getattr(args, name, None)
        if not isinstance(value, str) or not value:
            continue
        path = Path(value)
        for run in (path, path.parent, path.parent.parent):
            found = _game_module(run / "config.json")
            if found is not None:
                try:
                    import_game_module(*found)
                except UserError as exc:
                    problems.append(str(exc))
                break
    return problems


def _game_module(path: Path) -> tuple[str, str] | None:
    """(game_module, game) of a run's config.json, None when there is none or it names no module."""
    import json

    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("game_module"), str) or not data["game_module"]:
        return None
    return data["game_module"], str(data.get("game", ""))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problems: list[str] = []
    try:
        _check_match_argument(args)
        problems = _import_games(args)
        result = args.run(args)
    except UserError as exc:
        message = str(exc)
        if problems and "unknown game" in message:  # why: the run's game_module did not import
            message = problems[0]
        # one line, and no terminal control from text a submission or a file put in the message
        print(f"ludus: error: {printable(message).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`ludus status RUN | head -1`): stop quietly, as Unix tools do; stdout
        # goes to /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (OSError, sqlite3.OperationalError) as exc:
        full = isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc)
        if not full and getattr(exc, "errno", None) not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                                                            errno.EPERM):
            raise
        # the disk, not Ludus: writes are atomic (temporary file, then rename), so nothing stored is damaged
        print(f"ludus: error: {printable(str(exc))} (nothing stored was changed; free space or fix permissions, "
              f"then run the command again, or `ludus resume` a run)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ludus: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)
