"""Exploiter probe: how much can a fresh learner win against a frozen checkpoint?

For games too big for an exact best response, train an approximate one (AlphaStar's exploiters,
Vinyals et al. 2019; "approximate best response" as in Timbers et al. 2022): a fresh PPO learner
(agents/rl/ppo.py, the league's own learner) plays only the frozen checkpoint, on the league's
runner, taking every seat in turn, for N of its own decisions. Its final score against the
checkpoint, with a Wilson 95% interval, lower-bounds how exploitable the checkpoint is; the score
of the untrained probe is reported too, so the gain is visible.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ludus.agents.rl.ppo import PPOConfig
from ludus.agents.threads import torch_threads
from ludus.evaluation.evaluate import EvaluationError, OpponentResult, evaluate_policies, pair_seed
from ludus.league.play.runner import MatchAssignment, PlayTask

if TYPE_CHECKING:
    from ludus.agents.policy import Policy
    from ludus.agents.rl.ppo import PPOLearner
    from ludus.league.play.runner import Runner

PROBE = "probe"
TARGET = "target"


@dataclass(frozen=True)
class ProbeConfig:
    """How the exploiter probe trains and is measured."""

    steps: int = 20_000
    """The probe's own decisions (env steps) to train for."""
    matches_per_update: int = 256
    """Games played between PPO updates (the probe takes each seat in turn)."""
    num_envs: int = 128
    """Games stepped at once by the runner."""
    eval_games: int = 400
    """Games of the final (and initial) measurement against the checkpoint, rounded up to whole seat rotations."""
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(learning_rate=1e-3, num_minibatches=4, update_epochs=4,
                                                             ent_coef=0.01))
    """PPO hyperparameters of the probe (the league's tic_tac_toe preset values)."""

    def __post_init__(self) -> None:
        for name in ("steps", "matches_per_update", "num_envs", "eval_games"):
            if getattr(self, name) < 1:
                raise EvaluationError(f"probe {name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ProbeResult:
    """What the exploiter probe achieved against the checkpoint."""

    checkpoint: str
    snapshot_id: str
    game_id: str
    steps: int
    """Decisions the probe trained on."""
    updates: int
    """PPO updates taken."""
    training_games: int
    initial: OpponentResult
    """The untrained probe's results against the checkpoint."""
    final: OpponentResult
    """The trained probe's results against the checkpoint (score, Wilson 95% interval)."""
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)


def probe_checkpoint(checkpoint_path: str | os.PathLike, steps: int | None = None, seed: int = 0,
                     config: ProbeConfig = ProbeConfig()) -> ProbeResult:
    """Train a fresh PPO exploiter against a frozen snapshot and measure it.

    The probe's net has the checkpoint's architecture (same capacity) and fresh weights; both
    players sample from their policies, in training and in the measurement. `steps` overrides
    `config.steps`.
    """
    import torch

    from ludus.agents.nets import ActorCritic
    from ludus.agents.rl.ppo import PPOLearner
    from ludus.agents.snapshot import load_snapshot
    from ludus.agents.torch_policy import TorchPolicy
    from ludus.league.play.backends import make_runner

    start = time.perf_counter()
    total_steps = config.steps if steps is None else int(steps)
    if total_steps < 1:
        raise EvaluationError(f"probe steps must be >= 1, got {total_steps}")
    loaded = load_snapshot(Path(checkpoint_path))
    spec = loaded.spec
    if spec.num_players < 2:
        raise EvaluationError(f"an exploiter probe needs a game of two or more players; {spec.id!r} has one")
    # Fresh weights from the probe's own seed, without touching torch's global generator.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(pair_seed(seed, 1 << 31) & 0x7FFFFFFF)
        net = ActorCritic(spec, loaded.net_config)
    learner = PPOLearner(net, config.ppo, seed=pair_seed(seed, (1 << 31) + 1) & 0x7FFFFFFF)
    policies = {PROBE: TorchPolicy(net), TARGET: TorchPolicy(loaded.net)}

    def measure() -> OpponentResult:
        (result,) = evaluate_policies(spec.id, policies[PROBE], {TARGET: policies[TARGET]}, config.eval_games,
                                      seed=pair_seed(seed, (1 << 31) + 2), num_envs=config.num_envs)
        return result

    initial = measure()
    runner = make_runner(spec.id, config.num_envs, seed)
    with torch_threads():
        trained, updates, games = _train(runner, learner, policies, spec.num_players, total_steps, seed, config)
    net.eval()
    final = measure()
    return ProbeResult(checkpoint=str(checkpoint_path), snapshot_id=loaded.ref.snapshot_id, game_id=spec.id,
                       steps=trained, updates=updates, training_games=games, initial=initial, final=final,
                       seconds=time.perf_counter() - start)


def _train(runner: Runner, learner: PPOLearner, policies: dict[str, Policy], num_players: int, total_steps: int,
           seed: int, config: ProbeConfig) -> tuple[int, int, int]:
    """PPO iterations of the probe against the target until `total_steps` own decisions."""
    trained, match_id, games = 0, 0, 0
    planned_updates = None
    while trained < total_steps:
        assignments = []
        for _ in range(config.matches_per_update):
            seat = match_id % num_players
            players = tuple(PROBE if s == seat else TARGET for s in range(num_players))
            assignments.append(MatchAssignment(match_id, pair_seed(seed, (1 << 32) + match_id), players, "training"))
            match_id += 1
        task = PlayTask(task_id=learner.updates, assignments=tuple(assignments),
                        sample_seed=pair_seed(seed, (1 << 33) + learner.updates), learners=(PROBE,),
                        learner_versions=(learner.updates,), gamma=config.ppo.gamma,
                        gae_lambda=config.ppo.gae_lambda)
        result = runner.play(task, policies.__getitem__)
        batch_steps = result.learner_steps[PROBE]
        if planned_updates is None:
            # Game lengths vary, so the number of updates is estimated from the first batch.
            planned_updates = max(1, -(-total_steps // max(batch_steps, 1)))
        # CleanRL's linear decay when annealed: update u (from 0) uses lr * (1 - u / planned), never below lr / planned.
        progress = min(learner.updates / planned_updates, 1.0 - 1.0 / planned_updates)
        learner.set_learning_rate(config.ppo.learning_rate_at(progress, learner.updates))
        learner.update(result.rollouts[PROBE])
        trained += batch_steps
        games += len(result.matches)
    return trained, learner.updates, games


def format_probe(result: ProbeResult) -> str:
    f, i = result.final, result.initial
    return (f"exploiter probe vs {result.checkpoint} ({result.game_id}): {result.steps:,} steps, "
            f"{result.updates} PPO updates, {result.training_games:,} training games, {result.seconds:.1f} s\n"
            f"  untrained probe: score {i.score:.3f} [{i.lower:.3f}, {i.upper:.3f}] over {i.games} games\n"
            f"  trained probe:   score {f.score:.3f} [{f.lower:.3f}, {f.upper:.3f}] over {f.games} games "
            f"(W {f.wins} D {f.draws} L {f.losses})")
