"""Learner 'sdcfr': Single Deep CFR (agents/solvers/deep_cfr.py) as a league learner.

Its policy is an ordinary `ActorCritic` whose head is 'regret_matching', so its snapshots play,
rate, evaluate and enter the arena like any other net's. It differs from PPO in where its data
come from: CFR's traversals branch at the traverser's every decision, which needs the game tree,
so the learner walks pyspiel states itself (OpenSpiel games only) and ignores the rows of the
iteration's matches; those matches (keep them few) rate its snapshots and fill the ledger. One
update is `cfr.iterations_per_update` CFR iterations; a snapshot after every update
(`snapshot_every_steps: 1`) makes the snapshots the iterates that `output_policy:
uniform_average` mixes (`average` with `cfr.linear_weighting`), as Single Deep CFR's average
strategy (Steinberger 2019).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ludus.agents.solvers.deep_cfr import SDCFRLearner
from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.rollout import RolloutBatch
from ludus.agents.snapshot import Lineage, SnapshotRef
from ludus.games.core import GameSpec
from ludus.league.learners.base import ActorCriticArchitecture
from ludus.league.seeds import rng_from_tensor, rng_to_tensor


class SDCFRLeagueLearner:
    def __init__(self, spec: GameSpec, config: Any, net: NetConfig, seed: int, init_seed: int):
        from ludus.games.adapters.spiel import spiel_game_for, spiel_observation, spiel_observation_kind

        game = spiel_game_for(config.game)
        kind = spiel_observation_kind(config.game)

        def observe(state, seat):
            return spiel_observation(state, seat, kind)

        self.spec, self.net_config = spec, net
        torch.manual_seed(init_seed)  # initial weights, as PPO's learner
        self.cfr = SDCFRLearner(game, observe, ActorCritic(spec, net), config.cfr, seed)
        self.architecture = ActorCriticArchitecture(net)

    @property
    def module(self) -> nn.Module:
        return self.cfr.net

    @property
    def updates(self) -> int:
        return self.cfr.updates

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        """CFR iterations on the learner's own traversals; `batch` (the matches' rows) is not trained on."""
        stats = self.cfr.update()
        return {k: float(v) for k, v in stats.__dict__.items()}

    def freeze(self, directory: Path, lineage: Lineage) -> SnapshotRef:
        from ludus.agents.snapshot import save_snapshot

        return save_snapshot(self.cfr.net, self.spec, self.net_config, directory, lineage)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.cfr.state_dict(), "rng": rng_to_tensor(self.cfr.rng)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.cfr.load_state_dict({k: v for k, v in state.items() if k != "rng"})
        # in place: the sampler holds the same generator object
        self.cfr.rng.bit_generator.state = rng_from_tensor(state["rng"]).bit_generator.state

    def reset_to(self, snapshot: Path, seed: int) -> None:
        raise ValueError("learner 'sdcfr' does not reset to a snapshot (CFR's iterates build on all "
                         "earlier ones); set reset_every_snapshots 0")
