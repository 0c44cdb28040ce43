"""`ludus play` and `ludus export`. Nothing heavy is imported until a command runs."""

from __future__ import annotations

import argparse


def _run_play(args: argparse.Namespace) -> int:
    import numpy as np

    from ludus.agents.play import play_terminal

    if args.web:
        from ludus.agents.play_web import serve_local

        serve_local(args.game, args.against, seat=args.seat, seed=args.seed, port=args.port)
        return 0
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    print(f"seed {seed} (replay this game with --seed {seed})")
    play_terminal(args.game, args.against, human_seat=args.seat, seed=seed)
    return 0


FILE_SUFFIXES = (".onnx", ".pt", ".ts")
"""An --out ending so names one file: a one-snapshot policy exports to it, a mixture of several
members refuses it (they go into a directory with members.json)."""


def _run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ludus.agents.export import TOLERANCE, MIXTURE_FORMAT, ExportError, export_mixture, export_snapshot
    from ludus.agents.mixture import component_paths, is_mixture, read_mixture, run_checkpoint

    args.snapshot = run_checkpoint(args.snapshot)  # a run directory stands for its output policy
    if is_mixture(args.snapshot):
        mixture = read_mixture(args.snapshot)
        paths = component_paths(args.snapshot, mixture)
        one_file = Path(args.out).suffix in FILE_SUFFIXES
        if args.format != MIXTURE_FORMAT and one_file and len(paths) == 1 and paths[0] is not None:
            args.snapshot = paths[0]  # a policy of one snapshot (a run's newest main): its net, to one file
        else:
            if one_file:
                raise ExportError(f"{args.snapshot} is a mixture of {len(paths)} members: --out names a new "
                                  f"directory for each member's file and members.json, not {args.out}")
            files = export_mixture(args.snapshot, args.format, args.out)
            print("\n".join(f"wrote {path}" for path in files))
            if args.format != MIXTURE_FORMAT:
                print(f"(each member checked against its torch net: max |diff| <= {TOLERANCE:g})")
            return 0
    if args.format == MIXTURE_FORMAT:
        raise ExportError(f"{args.snapshot} is not a mixture checkpoint (no mixture.json): --format mixture "
                          f"exports a league's output policy, e.g. runs/x/output_policy")
    report = export_snapshot(args.snapshot, args.format, args.out)
    print(f"wrote {report.path} ({report.format}, one file); checked on random inputs, max |diff| vs the torch net: "
          f"logits {report.max_abs_diff_logits:.1e}, value {report.max_abs_diff_value:.1e}")
    return 0


def register(subparsers) -> None:
    play = subparsers.add_parser(
        "play", help="play a game in the terminal (or the browser: --web) against a bot or a snapshot",
        description="Play GAME in the terminal: the board is drawn, legal move numbers are listed, "
                    "you type one. Ctrl-D quits. With --web, play it on a page in the browser instead.")
    play.add_argument("game", metavar="GAME", help="game id, e.g. tic_tac_toe or spiel:connect_four")
    play.add_argument("--against", required=True, metavar="BOT|SNAPSHOT",
                      help="a bot (random, mcts-100, mcts(simulations=100,uct_c=1.4), perfect) "
                           "or a snapshot directory")
    play.add_argument("--seat", type=int, default=0, help="your seat (0 moves first; default 0)")
    play.add_argument("--seed", type=int, default=None, help="seed of the game and the opponent (default: random)")
    play.add_argument("--web", action="store_true",
                      help="play in the browser instead: serve the play page on http://127.0.0.1:PORT/ (loopback "
                           "only; board games by clicking, text games by typing)")
    play.add_argument("--port", type=int, default=8001, help="--web: the port (default 8001)")
    play.set_defaults(run=_run_play)

    export = subparsers.add_parser(
        "export", help="export a snapshot's net to TorchScript or ONNX, or a mixture as its members",
        description="Write the snapshot's actor-critic (inputs obs, mask; outputs logits, value) and "
                    "check the file reproduces the net. A mixture checkpoint (a run's output_policy) is "
                    "written into the directory --out: each member exported plus members.json with the "
                    "weights, or with --format mixture a self-contained copy (an arena submission).")
    export.add_argument("snapshot", metavar="SNAPSHOT", help="snapshot or mixture directory")
    export.add_argument("--format", required=True, choices=("torchscript", "onnx", "mixture"))
    export.add_argument("--out", required=True, metavar="FILE|DIR",
                        help="file to write (x.onnx, x.pt: one file, also for a run whose output policy is one "
                             "snapshot), or a new directory for a mixture (each member's file and members.json)")
    export.set_defaults(run=_run_export)
