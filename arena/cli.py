"""`ludus arena submit|list|run|leaderboard|replay|doctor|serve|token|withdraw`: thin shells over
ludus.arena.api and ludus.arena.service."""

from __future__ import annotations

import argparse

from ludus.text import one_line, printable


def _say(text: str) -> None:
    """Print with control characters escaped: names, versions, fault reasons and stderr come from
    submissions, and must not drive the operator's terminal."""
    print(printable(str(text)))


def _cell(value: object) -> str:
    """One field of a listing, newlines escaped too: `printable` keeps them for text of many lines,
    and a version holding a newline and a fake row (in an arena stored before submit refused such
    manifests) would otherwise print as a row of its own."""
    return one_line(str(value))


def register(sub: argparse._SubParsersAction) -> None:
    arena = sub.add_parser("arena", help="sandboxed tournaments between submitted agents, with a rated leaderboard")
    commands = arena.add_subparsers(dest="arena_command", metavar="SUBCOMMAND")
    commands.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--arena", dest="arena_dir", default=None, metavar="DIR",
                        help="arena directory (default: $LUDUS_ARENA, else ./arena_state)")
    isolation = argparse.ArgumentParser(add_help=False)
    isolation.add_argument("--allow-unisolated", action="store_true",
                           help="run agents even where the sandbox has no namespaces (trusted code only)")
    time_control = argparse.ArgumentParser(add_help=False)
    time_control.add_argument("--time-per-move", type=float, default=None, help="seconds per move (default 1.0)")
    time_control.add_argument("--overage", type=float, default=None,
                              help="overage bank in seconds per match (default 5.0)")

    p = commands.add_parser("submit", parents=[common, isolation],
                            help="validate an agent and enter it (folder, executable, snapshot, or bot:NAME)")
    p.add_argument("path", help="agent folder with agent.toml, executable file, league snapshot directory, or "
                                "a built-in bot as bot:random, bot:mcts-50, bot:perfect")
    p.add_argument("--name", default=None, help="enter it under this name (default: the name in its manifest)")
    p.add_argument("--game", default=None, help="the arena's game, needed when the first entrant plays any game")
    p.set_defaults(run=_submit)

    p = commands.add_parser("list", parents=[common], help="the entrants")
    p.set_defaults(run=_list)

    p = commands.add_parser("run", parents=[common, isolation, time_control], help="play a tournament among all entrants")
    p.add_argument("--game", default=None, help="the arena's game (checked; default: the arena's)")
    p.add_argument("--format", choices=["round-robin", "ladder"], default="round-robin")
    p.add_argument("--games-per-pair", type=int, default=2,
                   help="games per pairing, even: each seed is played in both seat orders (default 2)")
    p.add_argument("--seed", type=int, default=None, help="tournament seed (default: the tournament's number)")
    p.add_argument("--workers", type=int, default=None,
                   help="matches played at once (default: one per core); each agent plays one at a time")
    p.add_argument("--max-games", type=int, default=None, help="ladder: game budget (default 400)")
    p.add_argument("--sigma", type=float, default=None, help="ladder: stop when every sigma is below this (default 2)")
    p.set_defaults(run=_run)

    p = commands.add_parser("leaderboard", parents=[common], help="ratings table and head-to-head matrix")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="also write a static page (replays go to FILE's stem + _replays/ beside it)")
    p.set_defaults(run=_leaderboard)

    p = commands.add_parser("replay", parents=[common], help="a match move by move, with boards")
    p.add_argument("match", type=int, help="match number (`ludus matches --arena DIR` lists them)")
    p.add_argument("--html", metavar="FILE", help="write the match's replay player (a self-contained page) instead "
                                                  "of printing its boards")
    p.set_defaults(run=_replay)

    p = commands.add_parser("serve", parents=[common, isolation, time_control],
                            help="the arena as an HTTP service: uploads, a continuous rating ladder, live pages")
    p.add_argument("--game", default=None, help="the arena's game (needed to create a new arena)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--no-schedule", action="store_true", help="serve and take uploads, but play no matches")
    p.add_argument("--placement-games", type=int, default=6, help="games a new entrant plays first (default 6)")
    p.add_argument("--pairs-per-round", type=int, default=2, help="pairings per scheduler round (default 2)")
    p.add_argument("--workers", type=int, default=None, help="matches at once (default: one per core)")
    p.add_argument("--uploads-per-hour", type=int, default=30, help="per account (default 30)")
    p.add_argument("--max-upload-mb", type=int, default=64, help="largest archive accepted (default 64 MiB)")
    p.add_argument("--human-move-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a person at the /play page who does not move this long forfeits (default 300)")
    p.add_argument("--human-games", type=int, default=8, metavar="N",
                   help="games with people in progress at once (default 8; one per account)")
    p.set_defaults(run=_serve)

    token = commands.add_parser("token", help="accounts of the arena service: API tokens")
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION")
    token_commands.required = True
    p = token_commands.add_parser("add", parents=[common], help="make an account and print its token (once)")
    p.add_argument("name", help="account name")
    p.add_argument("--game", default=None, help="the arena's game (needed to create a new arena)")
    p.set_defaults(run=_token_add)
    p = token_commands.add_parser("list", parents=[common], help="the accounts")
    p.set_defaults(run=_token_list)
    p = token_commands.add_parser("revoke", parents=[common], help="remove an account's token")
    p.add_argument("name", help="account name")
    p.set_defaults(run=_token_revoke)

    p = commands.add_parser("withdraw", parents=[common],
                            help="take an entrant out of scheduling and the leaderboard (its matches stay)")
    p.add_argument("entrant", help="entrant name, as `ludus arena list` shows it")
    p.set_defaults(run=_withdraw)

    p = commands.add_parser("doctor", parents=[common],
                            help="which sandbox features work on this machine (exit 1 if not isolated)")
    p.set_defaults(run=_doctor)


def _config(args):
    from ludus.arena.api import ArenaConfig
    from ludus.arena.match import MatchLimits

    defaults = ArenaConfig()
    limits = defaults.match_limits
    time_per_move = getattr(args, "time_per_move", None)
    overage = getattr(args, "overage", None)
    if time_per_move is not None or overage is not None:
        limits = MatchLimits(time_per_move_s=limits.time_per_move_s if time_per_move is None else time_per_move,
                             overage_s=limits.overage_s if overage is None else overage)
    return ArenaConfig(match_limits=limits, require_isolation=not getattr(args, "allow_unisolated", False))


def _short(entrant) -> str:
    """A bot's digest is its name; a submission's is a sha256, shown by its first 12 digits."""
    return entrant.digest if entrant.kind == "bot" else f"digest {entrant.digest[:12]}"


def _open(args, game=None):
    from ludus.arena.api import Arena

    return Arena.open(args.arena_dir, game, _config(args))


def _submit(args) -> int:
    arena = _open(args, args.game)
    before = {e.player_id for e in arena.list()}
    entrant = arena.submit(args.path, name=args.name)
    verb = "already entered" if entrant.player_id in before else "entered"
    _say(f"{verb} {_cell(entrant.player_id)} ({entrant.kind}, {entrant.submission_kind.value}, {_short(entrant)}) "
          f"in the {_cell(arena.game)} arena {_cell(arena.directory)}")
    twins = arena.same_content(entrant)
    if twins:
        _say(f"warning: {_cell(entrant.player_id)} has the same content as {_cell(', '.join(twins))}; "
             f"`ludus arena withdraw NAME` takes one out")
    return 0


def _list(args) -> int:
    import time

    arena = _open(args)
    entrants = arena.list()
    if not entrants:
        _say(f"no entrants in {_cell(arena.directory)}")
        return 0
    _say(f"{len(entrants)} entrants in the {_cell(arena.game)} arena {_cell(arena.directory)}")
    names = [_cell(e.player_id) for e in entrants]
    width = max(len(name) for name in names)
    for name, e in zip(names, entrants):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created_at))
        _say(f"  {name:<{width}}  {_cell(e.kind):<10} {e.submission_kind.value:<10} {_cell(e.version):<12} "
             f"{_cell(_short(e)):<19}  {when}  {_cell(e.source)}")
    return 0


def _run(args) -> int:
    from ludus.arena.tournament import format_report

    arena = _open(args, args.game)
    report = arena.run_tournament(args.game, args.format, args.games_per_pair, args.seed,
                                  max_games=args.max_games, sigma_threshold=args.sigma, workers=args.workers,
                                  progress=_say)
    _say(format_report(report))
    return 0


def _leaderboard(args) -> int:
    from ludus.arena.leaderboard import format_leaderboard, write_page

    board = _open(args).leaderboard()
    _say(format_leaderboard(board))
    if args.html:
        files = write_page(board, args.html)
        _say(f"wrote {files.html} and {files.replays} replays in {files.replay_dir}")
    return 0


def _replay(args) -> int:
    arena = _open(args)
    if not args.html:
        _say(arena.replay(args.match))
        return 0
    from pathlib import Path

    from ludus.files import atomic_write_bytes
    from ludus.league.records.replay import match_episode
    from ludus.replay_page import replay_html

    match = arena.match(args.match)
    atomic_write_bytes(Path(args.html), replay_html(match_episode(match), f"Arena match {match.match_id}").encode())
    _say(f"replay player: {args.html}")
    return 0


def _serve(args) -> int:
    from ludus.agents.human_seat import HumanSettings
    from ludus.arena.scheduler import SchedulerSettings
    from ludus.arena.service import ServiceConfig, serve
    from ludus.arena.uploads import UploadLimits

    arena = _open(args, args.game)
    arena.create()
    config = ServiceConfig(host=args.host, port=args.port, schedule=not args.no_schedule,
                           upload=UploadLimits(max_upload_bytes=args.max_upload_mb << 20),
                           uploads_per_hour=args.uploads_per_hour,
                           scheduler=SchedulerSettings(placement_games=args.placement_games,
                                                       pairs_per_round=args.pairs_per_round, workers=args.workers),
                           human=HumanSettings(move_timeout_s=args.human_move_timeout, max_games=args.human_games))
    serve(arena, config)
    return 0


def _token_add(args) -> int:
    from ludus.arena.accounts import add_account
    from ludus.league.records.ledger import Store

    arena = _open(args, args.game)
    arena.create()
    with Store.open(arena.directory, mode="write") as store:
        token = add_account(store, args.name)
    _say(f"account {args.name} in the {arena.game} arena {arena.directory}; its token (shown only now):")
    print(token)
    return 0


def _token_list(args) -> int:
    import time

    from ludus.arena.accounts import accounts
    from ludus.league.records.ledger import Store

    arena = _open(args)
    if arena.info() is None:
        _say(f"no arena in {arena.directory}")
        return 0
    with Store.open(arena.directory, mode="read") as store:
        found = accounts(store)
    for account in found:
        _say(f"  {_cell(account.name)}  since {time.strftime('%Y-%m-%d %H:%M', time.localtime(account.created_at))}")
    if not found:
        _say("no accounts: `ludus arena token add NAME` makes one")
    return 0


def _change(args, change) -> None:
    """Apply `change(store)` to an existing arena's ledger (opened for writing)."""
    from ludus.arena.store import ArenaError
    from ludus.league.records.ledger import Store

    arena = _open(args)
    if arena.info() is None:
        raise ArenaError(f"no arena in {arena.directory}: `ludus arena token add NAME --game GAME` or "
                         f"`ludus arena submit` creates one")
    with Store.open(arena.directory, mode="write") as store:
        change(store)


def _token_revoke(args) -> int:
    from ludus.arena.accounts import revoke_account

    _change(args, lambda store: revoke_account(store, args.name))
    _say(f"revoked the token of {args.name}")
    return 0


def _withdraw(args) -> int:
    from ludus.arena.accounts import withdraw

    _change(args, lambda store: withdraw(store, args.entrant))
    _say(f"withdrew {args.entrant}: it plays no more matches and leaves the leaderboard (its matches stay)")
    return 0


def _doctor(args) -> int:
    from ludus.arena.doctor import doctor, format_doctor

    report = doctor()
    _say(format_doctor(report))
    return 0 if report.isolated else 1
