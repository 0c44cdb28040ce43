"""Learners as the league sees them: one seam for PPO, token-level PPO and MAPPO.

The manager only needs a learner to (1) ship its policy weights to runners with a version,
(2) take an update from the trajectories the runners recorded, (3) freeze itself into a
snapshot, (4) checkpoint and restore exactly, and (5) reset to a snapshot (exploiters).
Runners rebuild a learner's policy from its `PolicyArchitecture` record + weights. Token PPO's
learner and architecture live in league/learners/dialogue.py; `ludus.league.learners.kinds` is the table of kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.policy import Policy
from ludus.agents.rollout import RolloutBatch
from ludus.agents.snapshot import Lineage, SnapshotRef
from ludus.games.core import GameSpec


class PolicyArchitecture(Protocol):
    """Enough to rebuild a learner's policy module anywhere (a runner process, a Ray actor): a
    frozen record of our own types, sent to our own runners."""

    @property
    def lm_base(self) -> Any:
        """The `PretrainedLMConfig` that the league's frozen LM snapshots load onto; None without LMs."""
        ...

    def build(self, spec: GameSpec) -> tuple[nn.Module, Policy]:
        """A fresh policy module and the Policy acting with it; its weights are whatever the
        caller loads next (a runner loads the learner's)."""
        ...


@dataclass(frozen=True)
class ActorCriticArchitecture:
    """An `ActorCritic` net acting through `TorchPolicy` (learner 'ppo')."""

    net: NetConfig
    lm_base = None

    def build(self, spec: GameSpec) -> tuple[nn.Module, Policy]:
        from ludus.agents.torch_policy import TorchPolicy

        net = ActorCritic(spec, self.net)
        return net, TorchPolicy(net)


class LeagueLearner(Protocol):
    architecture: PolicyArchitecture
    module: nn.Module
    """The policy module whose state_dict runners receive."""

    @property
    def updates(self) -> int:
        """Number of updates so far: the policy version."""
        ...

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        """One learning step on the learner's trajectories; `progress` in [0, 1] for annealing."""
        ...

    def freeze(self, directory: Path, lineage: Lineage) -> SnapshotRef: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...

    def reset_to(self, snapshot: Path, seed: int) -> None:
        """Restart from a snapshot's weights with a fresh optimizer (AlphaStar's exploiter reset)."""
        ...


def module_weights(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's weights as numpy arrays for runners; bf16 (numpy has none) travels as fp32."""
    return {k: (v.detach().float() if v.dtype == torch.bfloat16 else v.detach()).cpu().numpy().copy()
            for k, v in module.state_dict().items()}


class PPOLeagueLearner:
    """PPO (agents/rl/ppo.py) on an ActorCritic."""

    def __init__(self, spec: GameSpec, net_config: NetConfig, ppo_config: Any, seed: int, init_seed: int,
                 backend_factory=None):
        from ludus.agents.rl.ppo import PPOLearner

        self.spec = spec
        self.net_config = net_config
        self.ppo_config = ppo_config
        self.backend_factory = backend_factory
        torch.manual_seed(init_seed)  # initial weights (ActorCritic draws from torch's generator)
        net = ActorCritic(spec, net_config)
        self.ppo = PPOLearner(net, ppo_config, seed=seed, backend=self._backend(net))
        self.architecture = ActorCriticArchitecture(net_config)

    def _backend(self, net: ActorCritic):
        return self.backend_factory(net) if self.backend_factory is not None else None

    @property
    def module(self) -> nn.Module:
        return self.ppo.net

    @property
    def updates(self) -> int:
        return self.ppo.updates

    def update(self, batch: RolloutBatch, progress: float, shard=None) -> dict[str, float]:
        """One PPO update; `shard` (ludus.agents.rl.ppo.DataShard): this rank's rows of a data-parallel batch."""
        self.ppo.set_learning_rate(self.ppo_config.learning_rate_at(progress, self.ppo.updates))
        stats = self.ppo.update(batch, shard)
        return {k: float(v) for k, v in stats.__dict__.items() if isinstance(v, (int, float))}

    def freeze(self, directory: Path, lineage: Lineage) -> SnapshotRef:
        from ludus.agents.snapshot import save_snapshot

        return save_snapshot(self.ppo.net, self.spec, self.net_config, directory, lineage)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.ppo.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.ppo.load_state_dict(state)

    def reset_to(self, snapshot: Path, seed: int) -> None:
        from ludus.agents.rl.ppo import PPOLearner
        from ludus.agents.snapshot import load_snapshot

        loaded = load_snapshot(snapshot, expect_game=self.spec.id)
        net = ActorCritic(self.spec, self.net_config)
        net.load_state_dict(loaded.net.state_dict())
        updates = self.ppo.updates
        self.ppo = PPOLearner(net, self.ppo_config, seed=seed, backend=self._backend(net))
        self.ppo.updates = updates  # versions keep increasing: runners key weights by version


def make_ppo_learner(spec: GameSpec, config: Any, role_index: int, seed: int, init_seed: int) -> PPOLeagueLearner:
    """Learner kind 'ppo' in this process: role `role_index`'s `PPOLeagueLearner` of a `LeagueConfig`,
    updating through DeepSpeed when `learner_backend.backend` says so (the data-parallel helper
    ranks of league/learners/ranks.py build their replicas with it too)."""
    backend_factory = None
    if config.learner_backend.backend == "deepspeed":
        from ludus.agents.deepspeed_backend import make_update_backend

        def deepspeed_backend(net):
            return make_update_backend(net, config.ppo, config.learner_backend)

        backend_factory = deepspeed_backend
    return PPOLeagueLearner(spec, config.role_net(role_index), config.ppo, seed, init_seed, backend_factory)
