"""A pretrained LM learns a text game given only by its id, from play alone (issue 77).

Trains the `llm_any_game` preset (SmolLM2-135M-Instruct with LoRA, the default LM learner
`text_smmd`: sampled magnetic mirror descent on the listed answers with a learned critic, REINFORCE
with role baselines on free text; no game tree, no search) on `--game` for a wall-clock budget of
training time (matches included; a run past it exits without a figure), then plays the trained
LM against

* `anchor:base`, the untrained base model (adapters off), and
* the random legal mover, where the game lists its answers,

`--games` games a seat each, and reports the score (win 1, draw 0.5, loss 0) with a Wilson 95%
interval and the share of the LM's turns whose FIRST response named a legal move (free-text
games, where the game judges a move: the share of its moves the game accepted). For Kuhn poker
also the exploitability of the LM's played policy (exact: every response enumerated,
benchmarks/llm_kuhn.py). Prints the host's CPU flags that matter for the speed of a bf16 / fp32
CPU run (amx, avx512_bf16, avx512f, avx2) and the load.

    python benchmarks/llm_any_game.py --game spiel:kuhn_poker --minutes 30 --seed 0
    python benchmarks/llm_any_game.py --game tic_tac_toe --minutes 30 --seed 1
    python benchmarks/llm_any_game.py --game ta:ConnectFour-v0 --minutes 30

Ends with ``goal NAME: figure (target t) PASS|FAIL``: `llm_kuhn_from_play` (exploitability
<= 0.15 of the run's output policy: the recipe's average of its snapshots; the last iterate's is
printed beside it) for Kuhn poker, `llm_tictactoe_from_play` (>= 0.80 against the random mover and legal
first answers >= 0.99) for tic-tac-toe, else `llm_any_game` (the lower bound against the base > 0.5).
`--out FILE` keeps a run's result; `--combine FILE...` (no training) reads those of runs on
TextArena games and ends with `goal llm_any_textarena_game` (the worst lower bound against the
base > 0.5, on three games at least, two seeds each, one game with free-text moves):

    python benchmarks/llm_any_game.py --game ta:Nim-v0 --minutes 30 --seed 1 --games 200 --out nim1.json
    python benchmarks/llm_any_game.py --game ta:Nim-v0 --minutes 30 --seed 2 --games 200 --out nim2.json
    ...
    python benchmarks/llm_any_game.py --combine nim1.json nim2.json poker1.json poker2.json wild1.json wild2.json

A TextArena run holds ~8 GB in training with `--set text_lm.model.readings_mb=2048` (the base's
readings' cache: speed and memory, the same floats), so two fit side by side on a 24 GB host; the
evaluation's 200 games at once take up to ~13 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import host_line  # noqa: E402

from benchmarks.lm_training import budget_league, train_within  # noqa: E402

PRESET = "llm_any_game"
KUHN_GAMES = ("spiel:kuhn_poker",)
TTT_GAMES = ("tic_tac_toe", "spiel:tic_tac_toe")


def score_against(game: str, policy, opponent, games_per_seat: int, seed: int, threads: int):
    """(score, Wilson low, Wilson high, share of `policy`'s first answers that counted). Listed
    answers: the turns whose first response named a legal answer. Free text, where only the game
    judges a move: the share of its moves the game accepted (an invalid move is told why and
    answered again; the game counts each refusal)."""
    from ludus.evaluation.evaluate import CANDIDATE, policy_matches, tally_matches
    from ludus.games.registry import spec as game_spec
    from ludus.games.text import is_free_text

    policy.counts = {key: 0 for key in policy.counts}
    matches = policy_matches(game, policy, {"opponent": opponent}, 2 * games_per_seat, seed=seed, num_envs=200,
                             threads=threads)
    (result,) = tally_matches(matches, CANDIDATE, game_spec(game).team_of_seat)
    if is_free_text(policy.view):
        moves = refused = 0
        for match in matches:
            seat = match.assignment.players.index(CANDIDATE)
            moves += match.turns[seat] if match.turns else 0
            refused += match.text.invalid[seat] if match.text is not None else 0
        legal = 1.0 - refused / max(moves, 1)
    else:
        legal = policy.counts["first_valid"] / max(policy.counts["turns"], 1)
    return result.score, result.lower, result.upper, legal


CACHE_SIZES = ("text_lm.model.readings_mb",)
"""The settings a goal run may change: caches' sizes (speed and memory; the same floats)."""


def textarena_goal(results: list[dict]) -> str:
    """`goal llm_any_textarena_game` over runs' results: every TextArena run's lower bound against
    the base > 0.5, on three games at least with two seeds each, one game with free-text moves (the
    issue names games no preset names: the caller picks them). A run counts if it ended within its
    budget and changed no setting of the recipe but `CACHE_SIZES`."""
    games = [r for r in results if str(r.get("game", "")).startswith("ta:") and r.get("within_budget")
             and all(o.partition("=")[0] in CACHE_SIZES for o in r.get("overrides", []))]
    for r in games:
        changed = f", with {' '.join(r['overrides'])}" if r.get("overrides") else ""
        print(f"{r['game']} seed {r['seed']}: vs base {r['vs_base'][0]:.3f} [{r['vs_base'][1]:.3f}, "
              f"{r['vs_base'][2]:.3f}], accepted first answers {r['vs_base'][3]:.3f}, "
              f"{'free text' if r['free_text'] else 'listed answers'}{changed}")
    seeds: dict[str, set[int]] = {}
    for r in games:
        seeds.setdefault(r["game"], set()).add(r["seed"])
    seeded = sorted(game for game, s in seeds.items() if len(s) >= 2)
    worst = min((r["vs_base"][1] for r in games), default=0.0)
    ok = len(seeded) >= 3 and any(r["free_text"] for r in games if r["game"] in seeded) and worst > 0.5
    names = ", ".join(f"{game} ({len(seeds[game])} seeds)" for game in sorted(seeds))
    return (f"goal llm_any_textarena_game: worst lower bound against anchor:base {worst:.3f} over {names} "
            f"(target > 0.5 on 3 games with 2 seeds each, one free text) {'PASS' if ok else 'FAIL'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", help="a game id with a text view, e.g. spiel:kuhn_poker, ta:ID")
    parser.add_argument("--out", type=Path, default=None, help="also write the run's result (JSON) here")
    parser.add_argument("--combine", type=Path, nargs="+", default=None,
                        help="no training: read --out files of runs on TextArena games and print "
                             "goal llm_any_textarena_game over them")
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget (wall clock, matches included)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--games", type=int, default=400, help="games a seat against each opponent")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch and runner threads (default: the recipe's 2); on a host shared by more busy "
                             "processes than cores, 1 avoids threads waiting on each other")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="key=value on top of the default recipe (not for goal runs, but for "
                             "text_lm.model.readings_mb, a cache's size); the result records them")
    args = parser.parse_args()
    if args.combine:
        results = []
        for path in args.combine:
            try:
                results.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                parser.error(f"--combine {path}: not a result file of --out ({exc})")
        print(textarena_goal(results))
        return
    if not args.game:
        parser.error("--game is required (or --combine)")

    import torch

    from ludus.agents.lm.pretrained import trained_state
    from ludus.agents.lm.text_policy import TextLMPolicy
    from ludus.agents.policy import RandomPolicy
    from ludus.games.text import is_free_text

    print(f"{host_line()}; load {os.getloadavg()}", flush=True)
    threads = [f"torch_threads={args.threads}", f"runner_threads={args.threads}"] if args.threads else []
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="ludus-llm-any-")) / "run"
    league = budget_league(PRESET, args.seed, run_dir, [f"game={args.game}", *threads, *args.overrides])
    config = league.config
    print(f"game {args.game}: learner {config.learner}, budget {args.minutes:g} min, seed {args.seed}", flush=True)
    torch.set_num_threads(config.torch_threads)
    learner = league.learners["main"].impl
    budget = 60.0 * args.minutes
    loads: list[float] = []
    try:
        trained_seconds, iterations = train_within(league, budget, f"seed {args.seed} ",
                                                   lambda _: loads.append(os.getloadavg()[0]))
    finally:
        league.close()
    threads = config.torch_threads
    model, view, play = learner.lm.model, learner.view, learner.text.play
    adam_steps = getattr(getattr(learner, "smmd", None), "config", None)
    adam_steps = learner.updates * adam_steps.distill_steps if adam_steps is not None else None
    result = {"game": args.game, "seed": args.seed, "minutes": args.minutes, "iterations": iterations,
              "train_seconds": round(trained_seconds, 1), "updates": learner.updates, "adam_steps": adam_steps,
              "mean_load_during_training": round(sum(loads) / max(len(loads), 1), 2),
              "overrides": list(args.overrides)}
    goal = None
    if args.game in KUHN_GAMES:
        from benchmarks.llm_kuhn import exploitability_of_lm

        figure, table = exploitability_of_lm(TextLMPolicy(model, learner.lm.tokenizer, view, play))
        result["exploitability_last_iterate"] = figure
        print(f"the learner's last iterate: exploitability {figure:.4f}; P(bet or call): {table}", flush=True)
        if config.output_policy != "newest":
            # the run's output: the average of its snapshots (the last iterate of MMD from sampled Q
            # swings around the equilibrium; averaging iterates is fictitious play's remedy)
            from ludus.agents.mixture import OUTPUT_POLICY_DIR, read_mixture
            from ludus.agents.solvers.exploitability import exploitability, mixture_tabular

            mixed, _ = mixture_tabular(run_dir / OUTPUT_POLICY_DIR, args.game)
            figure = exploitability(args.game, mixed)
            members = len(read_mixture(run_dir / OUTPUT_POLICY_DIR).components)
            print(f"the run's output policy ({config.output_policy} of {members} snapshots): exploitability "
                  f"{figure:.4f}", flush=True)
        result["exploitability"] = figure
        goal = f"goal llm_kuhn_from_play: {figure:.4f} (target 0.15) {'PASS' if figure <= 0.15 else 'FAIL'}"
    trained = {k: v.detach().clone() for k, v in trained_state(model).items()}
    zeros = {k: torch.zeros_like(v) for k, v in trained.items()}  # zero adapters: the untrained base
    policy = TextLMPolicy(model, learner.lm.tokenizer, view, play, adapters=trained)
    base = TextLMPolicy(model, learner.lm.tokenizer, view, play, adapters=zeros)
    start = time.perf_counter()
    vs_base = score_against(args.game, policy, base, args.games, 1000 + args.seed, threads)
    result["vs_base"] = vs_base
    print(f"vs anchor:base: score {vs_base[0]:.3f} [{vs_base[1]:.3f}, {vs_base[2]:.3f}] over {2 * args.games} "
          f"games, legal first answers {vs_base[3]:.4f}", flush=True)
    vs_random = None
    free_text = is_free_text(view)
    if not free_text:  # a view that lists answers: the random legal mover is an opponent
        vs_random = score_against(args.game, policy, RandomPolicy(), args.games, 2000 + args.seed, threads)
        result["vs_random"] = vs_random
        print(f"vs random: score {vs_random[0]:.3f} [{vs_random[1]:.3f}, {vs_random[2]:.3f}] over "
              f"{2 * args.games} games, legal first answers {vs_random[3]:.4f}", flush=True)
    result["eval_seconds"] = round(time.perf_counter() - start, 1)
    result["load_at_end"] = os.getloadavg()[0]
    result["free_text"] = free_text
    result["within_budget"] = trained_seconds <= budget
    print(json.dumps(result), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result) + "\n")
    print(f"{iterations} iterations, {learner.updates} updates ({adam_steps} Adam steps of the adapters) in "
          f"{trained_seconds:.0f} s of training (mean load {result['mean_load_during_training']}, now "
          f"{result['load_at_end']:.2f})", flush=True)
    if trained_seconds > budget:
        raise SystemExit("past the budget: no goal")
    if args.game in TTT_GAMES and vs_random is not None:
        ok = vs_random[0] >= 0.80 and vs_random[3] >= 0.99
        goal = (f"goal llm_tictactoe_from_play: score {vs_random[0]:.3f}, legal {vs_random[3]:.4f} "
                f"(target 0.80, 0.99) {'PASS' if ok else 'FAIL'}")
    if goal is None:
        goal = (f"goal llm_any_game: lower bound against anchor:base {vs_base[1]:.3f} (target > 0.5) "
                f"{'PASS' if vs_base[1] > 0.5 else 'FAIL'}")
    print(goal, flush=True)


if __name__ == "__main__":
    main()
