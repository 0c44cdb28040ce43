"""`ludus games`: list the games, or check one against the game protocol.

    ludus games                      # table of native games and adapter examples
    ludus games --check ID           # run ludus.games.check.check_game on ID
    ludus games --describe ID        # facts, observation layout and action numbering of ID

Game modules (pyspiel, PettingZoo, Gymnasium) are imported inside the command, not here.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "games", help="list games; --check ID tests a game against the protocol",
        description="List the registered native games and example adapter ids (spiel:NAME, pz:MODULE, "
                    "gym:ID reach any OpenSpiel, PettingZoo or Gymnasium game), or check one.")
    parser.add_argument("--check", metavar="ID", help="run the conformance checker on this game id")
    parser.add_argument("--describe", metavar="ID",
                        help="print the game's facts, observation layout and what each action number means")
    parser.add_argument("--games", type=int, default=100, metavar="N",
                        help="random games the checker plays (default 100)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.check is not None:
        return _check(args.check, args.games)
    if args.describe is not None:
        print(describe(args.describe))
        return 0
    print(games_table())
    return 0


def _check(game_id: str, num_games: int) -> int:
    from ludus.games.check import GameCheckError, check_game
    from ludus.games.core import GameError

    if num_games < 1:
        raise GameError(f"--games must be >= 1, got {num_games}")
    try:
        report = check_game(game_id, num_games=num_games)
    except GameCheckError as failure:  # the verdict of the command, not a crash
        print(f"FAIL {failure}")
        return 1
    print(report.summary())
    return 0


def games_table() -> str:
    """One row per id of `registry.listed_ids()`: players, actions, observation shape, kind."""
    from ludus.games import registry
    from ludus.games.core import GameError

    header = ("id", "players", "actions", "observation", "moves", "notes")
    rows = [header]
    for game_id in registry.listed_ids():
        try:
            spec = registry.spec(game_id)
        except GameError as exc:  # e.g. an optional package (mpe2) is not installed
            rows.append((game_id, "-", "-", "-", "-", f"unavailable: {exc}"))
            continue
        notes = []
        if spec.zero_sum:
            notes.append("zero-sum" if spec.utility_sum == 0 else f"constant-sum {spec.utility_sum:g}")
        if spec.has_chance:
            notes.append("chance")
        if not spec.perfect_information:
            notes.append("hidden information")
        if spec.teams and len(set(spec.teams)) < spec.num_players:
            notes.append("teams")
        rows.append((game_id, str(spec.num_players), str(spec.num_actions),
                     "x".join(str(d) for d in spec.observation_shape) + f" {spec.observation_dtype}",
                     "simultaneous" if spec.simultaneous else "turns", ", ".join(notes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * len(header[-1]))
    return "\n".join(line.rstrip() for line in lines)


def _facts(spec) -> str:
    kinds = ["simultaneous moves" if spec.simultaneous else "turns"]
    if spec.zero_sum:
        kinds.append("zero-sum" if spec.utility_sum == 0 else f"constant-sum {spec.utility_sum:g}")
    kinds.append("chance" if spec.has_chance else "no chance")
    kinds.append("perfect information" if spec.perfect_information else "hidden information")
    if spec.teams and len(set(spec.teams)) < spec.num_players:
        kinds.append(f"teams {list(spec.teams)}")
    shape = "x".join(str(d) for d in spec.observation_shape)
    return (f"players {spec.num_players}, actions {spec.num_actions}, observation {shape} "
            f"{spec.observation_dtype}, at most {spec.max_length} steps, returns "
            f"{spec.min_utility:g}..{spec.max_utility:g}; {', '.join(kinds)}")


def describe(game_id: str) -> str:
    """What an agent author needs to know about a game: its facts, what each observation entry
    holds and what each action number means (the registry entry's text for native games; read
    from pyspiel, PettingZoo or Gymnasium for adapter ids)."""
    from ludus.games import registry

    game = registry.make(game_id)
    spec = game.spec
    lines = [spec.id, _facts(spec)]
    entry = registry.native_entry(game_id)
    if entry is not None:
        lines += [entry.summary, *(entry.layout or "observation and actions: see the game's module").splitlines()]
    else:
        lines += _adapter_layout(game_id, game)
    vocab = getattr(game, "vocab", None)
    if vocab is not None:
        lines.append("vocabulary (token id word): " + ", ".join(f"{i} {w}" for i, w in enumerate(vocab.words)))
    return "\n".join(lines)


def _adapter_layout(game_id: str, game) -> list[str]:
    """The adapter record's `layout` lines, or the generic text of adapted environments."""
    from ludus.games import registry

    adapter = registry.adapter_for(game_id)
    if adapter is not None and adapter.layout is not None:
        return adapter.layout(game)
    return ["observation: the adapted environment's observation space, flattened to float32 and zero-padded "
            "to the largest seat's (docs/games.md, Adapters)",
            "actions: the environment's Discrete action ids; illegal ones are masked"]
