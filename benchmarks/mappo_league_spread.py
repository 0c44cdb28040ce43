"""MAPPO in the league on MPE cooperative navigation: `ludus train simple_spread` for a wall-clock
budget per seed, then the share of the random -> scripted gap the trained actor closes.

Each seed trains the `simple_spread` preset (learner 'mappo': one actor shared by the three
agents, a centralised critic on the env's global state; league/learners/mappo.py) in its own process with
one torch thread, two seeds at a time on this 2-core machine; a run stops before the iteration
that would pass the budget (or at the preset's last iteration). The main learner's actor is then
evaluated greedily on the same evaluation episodes as a uniform random policy and the scripted
optimal-assignment policy (ludus.agents.bots.mpe_scripted), as benchmarks/mappo_spread.py does for the
stand-alone trainer:

    gap closed = (trained - random) / (scripted - random)   (mean episode return per agent)

    python benchmarks/mappo_league_spread.py [--seeds 0 1 2 3] [--budget 600] [--workers 2]

Ends with ``goal mappo_league_spread: <mean gap> (target 0.60, each seed >= 0.55) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

TARGET, SEED_TARGET = 0.60, 0.55


def train(seed: int, budget: float, run_root: str, eval_episodes: int, eval_seed: int, overrides: list[str]) -> dict:
    import torch

    from ludus.agents.rl.cooperative import evaluate_policy
    from ludus.agents.torch_policy import TorchPolicy
    from ludus.league.api import League, load_config

    torch.set_num_threads(1)
    config = load_config("simple_spread", [f"seed={seed}", "log.wandb=disabled", "log.tensorboard=false",
                                           "log.progress=false", *overrides])
    league = League.create(config, Path(run_root) / f"seed{seed}")
    trained, iterations, last = 0.0, 0, 0.0
    try:
        while iterations < config.iterations and trained + last <= budget:
            start = time.perf_counter()
            league.step()
            last = time.perf_counter() - start
            trained += last
            iterations += 1
    finally:
        league.close()
    actor = league.learners["main"].impl.module.actor.net
    evaluation = evaluate_policy(config.game, TorchPolicy(actor), eval_episodes, eval_seed, greedy=True)
    return {"seed": seed, "return": evaluation.mean, "se": evaluation.standard_error, "seconds": trained,
            "iterations": iterations, "steps": iterations * config.matches_per_iteration * 25}


def reference(name: str, game: str, eval_episodes: int, eval_seed: int) -> float:
    from ludus.agents.rl.cooperative import evaluate_policy
    from ludus.agents.bots.mpe_scripted import SpreadScriptedPolicy
    from ludus.agents.policy import RandomPolicy

    policy = {"random": RandomPolicy(), "scripted": SpreadScriptedPolicy()}[name]
    return evaluate_policy(game, policy, eval_episodes, eval_seed, greedy=True).mean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds per seed")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="preset overrides (key=value)")
    args = parser.parse_args()
    from ludus.league.api import load_config

    game = load_config("simple_spread", args.overrides).game
    started = time.perf_counter()
    print(f"simple_spread preset ({game}), seeds {args.seeds}, {args.budget:.0f} s each, {args.workers} at a time; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ludus-mappo-league-") as root, \
            ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = [pool.submit(train, seed, args.budget, root, args.eval_episodes, args.eval_seed, args.overrides) for seed in args.seeds]
        refs = {name: pool.submit(reference, name, game, args.eval_episodes, args.eval_seed)
                for name in ("random", "scripted")}
        results = [r.result() for r in runs]
        random_return, scripted_return = refs["random"].result(), refs["scripted"].result()
    gaps = []
    for r in results:
        gap = (r["return"] - random_return) / (scripted_return - random_return)
        gaps.append(gap)
        print(f"seed {r['seed']}: return {r['return']:.2f} +- {r['se']:.2f}, gap closed {gap:.3f} "
              f"({r['iterations']} iterations, {r['steps']:,} steps in {r['seconds']:.0f} s)")
    mean = float(np.mean(gaps))
    print(f"random {random_return:.2f}, scripted {scripted_return:.2f}; wall {time.perf_counter() - started:.0f} s, "
          f"load {os.getloadavg()[0]:.2f}")
    ok = mean >= TARGET and min(gaps) >= SEED_TARGET
    print(f"goal mappo_league_spread: {mean:.3f} (per seed {', '.join(f'{g:.3f}' for g in gaps)}; target {TARGET}, "
          f"each seed >= {SEED_TARGET}) {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
