"""`ludus train|resume|status|config|ratings|replay`: thin shells over ludus.league.api."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a league from a preset or a YAML config")
    p.add_argument("config", help="preset name (`ludus config list`) or path to a YAML file")
    p.add_argument("--run", dest="run_dir", default=None, help="run directory (default runs/<preset>-<seed>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set ppo.learning_rate=1e-3 (repeatable)")
    p.add_argument("--backend", choices=["serial", "process", "ray"], default=None,
                   help="shortcut for --set backend=...")
    p.add_argument("--ray-address", default=None, help="shortcut for --set ray_address=... (backend ray)")
    p.add_argument("--time-budget", type=duration, default=None, metavar="DURATION",
                   help="stop at the iteration boundary after which the next iteration would overrun this wall "
                        "clock (e.g. 90s, 30m, 2h, 1h30m); `ludus resume RUN` goes on")
    p.set_defaults(run=_train)

    p = sub.add_parser("resume", help="continue a run from its last checkpoint")
    p.add_argument("run_dir")
    p.add_argument("--iterations", type=int, default=None, help="run until this many iterations in total")
    p.add_argument("--time-budget", type=duration, default=None, metavar="DURATION",
                   help="stop at an iteration boundary within this wall clock, as `ludus train --time-budget`")
    p.set_defaults(run=_resume)

    p = sub.add_parser("status", help="population table of a run (works while it trains)")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_status)

    p = sub.add_parser("config", help="show presets and every config key")
    config_sub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    config_sub.required = True
    show = config_sub.add_parser("show", help="the keys its learner and game use, with value (default or preset), "
                                              "valid range and doc")
    show.add_argument("preset", nargs="?", default=None, help="preset name or YAML file (default: defaults)")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    which = show.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every key, the blocks of other learners included")
    which.add_argument("--diff", action="store_true", help="only the keys that differ from the defaults")
    show.add_argument("--yaml", action="store_true", help="print a runnable YAML file instead (`ludus train FILE` "
                                                          "builds the same config): the keys set away from the "
                                                          "defaults, with --all every key")
    show.set_defaults(run=_config_show)
    lst = config_sub.add_parser("list", help="preset names, each with what it trains")
    lst.set_defaults(run=_config_list)

    p = sub.add_parser("ratings", help="TrueSkill and Bradley-Terry ratings of a run's frozen members, with "
                                       "intervals, Nash averaging, rank stability and forfeits")
    p.add_argument("run_dir")
    p.add_argument("--rebuild", action="store_true",
                   help="replay the ledger in order and check it reproduces the stored ratings exactly")
    p.add_argument("--rounds", type=int, default=1000, help="bootstrap rounds of the intervals (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0; same seed, same intervals)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(run=_ratings)

    p = sub.add_parser("matches", help="a run's or an arena's matches, one a line, with filters")
    p.add_argument("run_dir", nargs="?", default=None, metavar="RUN", help="run directory (or give --arena DIR)")
    p.add_argument("--arena", dest="arena_dir", default=None, metavar="DIR", help="an arena directory instead")
    p.add_argument("--player", default=None, help="only matches of this player id (e.g. main, main@3, anchor:random)")
    p.add_argument("--status", default=None, help="only matches with a seat of this status (ok, error, timeout, "
                                                  "invalid)")
    p.add_argument("--kind", default=None, help="only matches of this kind (training, rating, evaluation, arena)")
    p.add_argument("--iteration", type=int, default=None,
                   help="only matches of this iteration (1-based; in an arena, this tournament)")
    p.add_argument("--game", default=None, help="only matches of this game (a run of several games, config key games)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=int, default=None, help="show the newest N that pass (default 50)")
    shown.add_argument("--all", action="store_true", help="show every match that passes")
    p.set_defaults(run=_matches)

    p = sub.add_parser("replay", help="re-simulate a match of a run from the ledger and check its returns")
    p.add_argument("run_dir")
    p.add_argument("match", type=int, help="match id")
    p.add_argument("--quiet", action="store_true", help="print only the verdict")
    p.add_argument("--html", metavar="FILE", help="write the match's replay player (a self-contained page) instead "
                                                  "of printing its boards")
    p.add_argument("--json", metavar="FILE", help="write the match as episode JSON (steps with boards) instead of "
                                                  "printing its boards")
    p.set_defaults(run=_replay)


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def duration(text: str) -> float:
    """Seconds of a DURATION: `90`, `90s`, `30m`, `2h`, `1h30m`, `1m30s` (argparse type)."""
    found = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or found is None or not any(found.groups()):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 90s, 30m, 2h or 1h30m")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in found.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be more than 0 seconds")
    return total


def _announce(config: dict, run_dir, verb: str) -> None:
    """A line before the league is built or restored (`config` as config.json holds it): a
    language model's weights can take minutes to load."""
    log, learner, game = config.get("log"), config.get("learner"), config.get("game")
    if isinstance(log, dict) and log.get("progress", True) and isinstance(learner, str) and isinstance(game, str):
        lm = " (loading a language model's weights can take minutes)" if "text" in learner else ""
        print(f"ludus: {verb} {run_dir}: building the {learner} learners for {game}{lm}", file=sys.stderr, flush=True)


def _train(args) -> int:
    started = time.monotonic()  # the time budget counts from here: loading weights is part of the run
    from ludus.league import api
    from ludus.league.config import config_to_dict

    overrides = list(args.overrides)
    if args.backend:
        overrides.append(f"backend={args.backend}")
    if args.ray_address:
        overrides.append(f"ray_address={args.ray_address}")
    config = api.load_config(args.config, overrides)
    run_dir = args.run_dir or api.default_run_dir(args.config, config)
    _announce(config_to_dict(config), run_dir, "creating")
    league = api.League.create(config, run_dir)
    league.on_population_change.extend(args.league_hooks(config))
    try:
        league.run(time_budget=args.time_budget, started=started)
    finally:
        league.close()
    print(api.format_status(api.status(run_dir)))
    print(next_commands(run_dir, config.game, stopped=league.stopped_by_budget))
    return 0


def next_commands(run_dir: str, game: str, stopped: bool = False) -> str:
    """What a user does with a finished run (or one stopped by its time budget), ready to paste."""
    import shlex

    run = shlex.quote(str(run_dir))
    # a run directory stands for its output policy, or its newest main snapshot before a learner's
    # second snapshot writes one (ludus.agents.mixture.run_checkpoint)
    lines = ["next:"]
    if stopped:
        lines.append(f"  ludus resume {run}   # the time budget stopped it: go on to its last iteration")
    lines += [
        f"  ludus report {run} --html {shlex.quote(str(Path(run_dir) / 'report.html'))}   # the run's page",
        f"  ludus matches {run}   # its matches, one a line (ludus replay {run} ID shows one)",
        f"  ludus evaluate {run} --against {run}   # its output policy against the population",
        f"  ludus play {shlex.quote(game)} --against {run}   # play it yourself"]
    if not stopped:
        lines.append(f"  ludus resume {run} --iterations N   # train on")
    return "\n".join(lines)


def _resume(args) -> int:
    started = time.monotonic()
    import json

    from ludus.league import api

    try:  # only to say what is loading: League.resume checks the run and names what is wrong with it
        _announce(json.loads((Path(args.run_dir) / "config.json").read_text()), args.run_dir, "resuming")
    except (OSError, ValueError, AttributeError):
        pass
    league = api.League.resume(args.run_dir)
    league.on_population_change.extend(args.league_hooks(league.config))
    try:
        league.run(until_iteration=args.iterations, time_budget=args.time_budget, started=started)
    finally:
        league.close()
    print(api.format_status(api.status(args.run_dir)))
    print(next_commands(args.run_dir, league.config.game, stopped=league.stopped_by_budget))
    return 0


def _status(args) -> int:
    import json

    from ludus.league.status import format_status, status  # not ludus.league.api: status must not import torch

    report = status(args.run_dir)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_status(report))
    return 0


def _config_show(args) -> int:
    from ludus.league import api
    from ludus.league.config import changed_keys, config_yaml, shown_keys
    from ludus.league.configio import describe, format_table

    config = api.load_config(args.preset, args.overrides)  # no preset: the defaults
    if args.yaml:
        print(config_yaml(config, everything=args.all), end="")
        return 0
    keys = None if args.all else changed_keys(config) if args.diff else shown_keys(config)
    if keys is not None and not args.diff:  # and every key given with --set, even at its default
        given = [item.split("=", 1)[0].strip() for item in args.overrides]
        keys |= {key for key, _, _ in describe(api.LeagueConfig, config)
                 if any(key == name or key.startswith(name + ".") for name in given)}
    print(format_table(api.LeagueConfig, config, keys))  # key, value, valid range, doc
    return 0


def _config_list(args) -> int:
    from ludus.league import api
    from ludus.league.config import preset_summary

    names = api.preset_names()
    width = max(len(name) for name in names)
    for name in names:
        print(f"{name:<{width}}  {preset_summary(name)}".rstrip())
    return 0


def _ratings(args) -> int:
    from ludus.league import api

    if args.rebuild:
        check = api.rebuild_ratings_check(args.run_dir)
        print(api.format_ratings(check.rebuilt))
        print(f"rebuilt from {check.rating_matches} rating matches: "
              f"{'identical to the stored ratings' if check.identical else 'DIFFERENT from the stored ratings'}")
        return 0 if check.identical else 1
    if args.rounds < 1:
        from ludus.errors import UserError

        raise UserError(f"--rounds must be >= 1, got {args.rounds}")
    ranking = api.run_ranking(args.run_dir, rounds=args.rounds, seed=args.seed)
    if args.json:
        import json

        print(json.dumps(ranking.to_json(), indent=2))
    else:
        print(api.format_run_ranking(ranking))
    return 0


def _matches(args) -> int:
    from ludus.errors import UserError
    from ludus.league.matchlist import DEFAULT_LIMIT, MatchFilter, format_listing, list_matches

    if (args.run_dir is None) == (args.arena_dir is None):
        raise UserError("give a run directory or --arena DIR (not both): `ludus matches RUN` or "
                        "`ludus matches --arena DIR`")
    directory = args.run_dir or args.arena_dir
    if args.arena_dir is not None:
        from ludus.league.records.ledger import LEDGER_FILENAME

        if not (Path(directory) / LEDGER_FILENAME).is_file():  # (the league may not import the arena)
            raise UserError(f"no arena in {directory}: its {LEDGER_FILENAME} is missing (`ludus arena submit PATH "
                            f"--game GAME --arena {directory}` makes one)")
    else:
        from ludus.league.rundata import read_run

        read_run(directory)  # one line if it is no run
    which = MatchFilter(args.player, args.status, args.kind, args.iteration, args.game)
    listing = list_matches(directory, which, None if args.all else DEFAULT_LIMIT if args.limit is None else args.limit)
    print(format_listing(listing, directory, arena=args.arena_dir is not None))
    return 0


def _replay(args) -> int:
    from ludus.league import api

    replay = api.replay_match(args.run_dir, args.match)
    if not args.quiet and not args.html and not args.json:  # with a file to write, only the verdict and the file
        print(replay.transcript)
    print(f"match {args.match}: recorded returns {list(replay.recorded_returns)}, replayed "
          f"{list(replay.replayed_returns)}: {'OK' if replay.matches else 'MISMATCH'}")
    if args.html or args.json:
        import json

        from ludus.league.records.replay import match_episode
        from ludus.files import atomic_write_bytes
        from ludus.replay_page import replay_html

        episode = match_episode(api.recorded_match(args.run_dir, args.match))
        if args.json:
            atomic_write_bytes(Path(args.json), json.dumps(episode, indent=1).encode())
            print(f"episode JSON: {args.json}")
        if args.html:
            title = f"{Path(args.run_dir).name}: match {args.match} ({episode['kind']})"
            atomic_write_bytes(Path(args.html), replay_html(episode, title).encode())
            print(f"replay player: {args.html}")
    return 0 if replay.matches else 1
