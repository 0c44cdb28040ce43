"""`ludus evaluate` and `ludus report`: thin shells over evaluation/*.py (imports happen in the commands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate", help="play a checkpoint against a run's population; exploitability; exploiter probe",
        description="Evaluate a snapshot directory: against every frozen member of a run (W/D/L with Wilson 95% "
                    "intervals, TrueSkill placement against the frozen ratings), exactly (exploitability, small "
                    "OpenSpiel games) and by training a fresh exploiter against it (probe). The run is only read.")
    p.add_argument("checkpoint", help="snapshot directory (e.g. runs/x/snapshots/main@3), a mixture directory "
                                      "(runs/x/output_policy, the league's output policy), or with "
                                      "--exploitability a run directory (output policy, newest and best snapshot)")
    p.add_argument("--against", dest="run_dir", metavar="RUN", default=None,
                   help="league run directory whose frozen members to play")
    p.add_argument("--games", type=int, default=100,
                   help="games per opponent, rounded up so every seed is played from every seat (default 100)")
    p.add_argument("--anchors", action="store_true", help="also play the run's anchor bots")
    p.add_argument("--greedy", action="store_true",
                   help="the checkpoint and snapshot opponents pick their most likely action instead of sampling")
    p.add_argument("--seed", type=int, default=0, help="seed of game seeds and action sampling (default 0)")
    p.add_argument("--runners", type=int, default=1, help="runner shards (default 1)")
    p.add_argument("--backend", choices=["serial", "process"], default="serial",
                   help="run the shards in this process or in worker processes (same results)")
    p.add_argument("--exploitability", action="store_true",
                   help="exact NashConv/exploitability (small spiel: games such as kuhn_poker, leduc_poker); "
                        "of a run directory: its output policy, newest and best snapshot")
    p.add_argument("--probe-steps", type=int, default=None, metavar="N",
                   help="train a fresh PPO exploiter against the checkpoint for N steps and report its score")
    p.add_argument("--base", metavar="DIR", default=None,
                   help="the base model directory an LM snapshot was trained on (when it is not a base Ludus ships)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(run=_evaluate)

    p = sub.add_parser("report", help="self-contained HTML report of a run (ratings, payoff, meta-game, genealogy)")
    p.add_argument("run_dir", metavar="RUN", help="league run directory (only read)")
    p.add_argument("--html", required=True, metavar="FILE", help="where to write the page")
    p.add_argument("--no-png", action="store_true", help="do not write PNG copies of the charts beside the page")
    p.set_defaults(run=_report)


def _evaluate(args) -> int:
    import json

    from ludus.errors import UserError

    if args.run_dir is None and not args.exploitability and args.probe_steps is None:
        raise UserError("nothing to evaluate: give --against RUN, --exploitability or --probe-steps N")
    from ludus.agents.mixture import is_run_directory, run_checkpoint

    if args.base is not None and (args.run_dir is not None or args.probe_steps is not None
                                  or is_run_directory(args.checkpoint)):
        # --against plays the snapshot on the run's own base model (text_lm.model.base of RUN's config)
        raise UserError("--base loads one LM snapshot for --exploitability only (--against RUN plays it on RUN's "
                        "base model, text_lm.model.base): drop --base, or run --exploitability SNAPSHOT on its own")

    output: dict = {"checkpoint": args.checkpoint}
    text: list[str] = []
    checkpoint = run_checkpoint(args.checkpoint)  # a run directory stands for its output policy
    if args.run_dir is not None:
        from ludus.evaluation.evaluate import evaluate_checkpoint, format_evaluation

        report = evaluate_checkpoint(checkpoint, args.run_dir, games_per_opponent=args.games,
                                     include_anchors=args.anchors, seed=args.seed, num_runners=args.runners,
                                     backend=args.backend, greedy=args.greedy)
        output["evaluation"] = report.to_json()
        text.append(format_evaluation(report))
    if args.exploitability and is_run_directory(args.checkpoint):
        from ludus.evaluation.output import format_run_exploitability, run_exploitability

        rows = run_exploitability(args.checkpoint)
        output["exploitability"] = [row.to_json() for row in rows]
        text.append(format_run_exploitability(rows))
    elif args.exploitability:
        from ludus.agents.solvers.exploitability import exploitability_of

        if args.base is not None:
            from ludus.agents.lm.pretrained import PretrainedLMConfig
            from ludus.agents.snapshot import policy_from_snapshot, read_manifest

            game_id = read_manifest(checkpoint)[0].game_id
            checkpoint = policy_from_snapshot(checkpoint, lm_base=PretrainedLMConfig(base=args.base))
            result = exploitability_of(checkpoint, game_id)
        else:
            result = exploitability_of(checkpoint)
        output["exploitability"] = result.to_json()
        exploit = "" if result.exploitability is None else f"exploitability {result.exploitability:.6f}  "
        text.append(f"{result.game_id}: {exploit}NashConv {result.nash_conv:.6f} "
                    f"(per-seat best-response gains {', '.join(f'{v:.4f}' for v in result.player_improvements)}; "
                    f"{result.seconds:.1f} s)")
    if args.probe_steps is not None:
        from ludus.evaluation.probe import format_probe, probe_checkpoint

        probe = probe_checkpoint(checkpoint, steps=args.probe_steps, seed=args.seed)
        output["probe"] = probe.to_json()
        text.append(format_probe(probe))
    print(json.dumps(output, indent=2) if args.json else "\n\n".join(text))
    return 0



def _report(args) -> int:
    from ludus.evaluation.report import format_files, write_report

    files = write_report(args.run_dir, args.html, png=not args.no_png)
    print("\n".join(format_files(files)))
    return 0
