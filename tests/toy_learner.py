"""A toy learner kind, added from outside the project: REINFORCE with plain SGD on an actor-critic net.

Nothing in Ludus names it: `register()` puts its `LearnerKind` in the table through the public API
(`ludus.league.api.register_learner_kind`), after which `learner=toy_reinforce` trains a league and
passes `check_learner` (tests/test_learner_kinds.py). Its snapshots are ordinary actor-critic
snapshots, so frozen members play through the snapshot loader Ludus already has.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ludus.agents.nets import ActorCritic
from ludus.league.api import LearnerKind, learner_kinds, register_learner_kind
from ludus.league.configio import ConfigError
from ludus.league.learners.base import ActorCriticArchitecture

NAME = "toy_reinforce"
LEARNING_RATE = 0.05


class ToyReinforceLearner:
    """A `LeagueLearner`: one SGD step of REINFORCE (returns as weights, no baseline) per update."""

    def __init__(self, spec, net_config, seed: int, init_seed: int):
        self.spec = spec
        self.net_config = net_config
        self.architecture = ActorCriticArchitecture(net_config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            self.module = ActorCritic(spec, net_config)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=LEARNING_RATE)
        self._updates = 0

    @property
    def updates(self) -> int:
        return self._updates

    def update(self, batch, progress: float) -> dict[str, float]:
        obs, mask = torch.as_tensor(batch.obs), torch.as_tensor(batch.mask)
        logits, _ = self.module(obs, mask)
        logp = torch.log_softmax(logits, -1).gather(1, torch.as_tensor(batch.actions)[:, None]).squeeze(1)
        loss = -(logp * torch.as_tensor(batch.returns)).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self._updates += 1
        return {"loss": float(loss.detach()), "rows": float(len(batch.actions))}

    def freeze(self, directory: Path, lineage):
        from ludus.agents.snapshot import save_snapshot

        return save_snapshot(self.module, self.spec, self.net_config, directory, lineage)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {f"net.{k}": v.detach().clone() for k, v in self.module.state_dict().items()}
        state["updates"] = torch.tensor(self._updates)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net.")})
        self._updates = int(state["updates"])

    def reset_to(self, snapshot: Path, seed: int) -> None:
        from ludus.agents.snapshot import load_snapshot

        self.module.load_state_dict(load_snapshot(snapshot, expect_game=self.spec.id).net.state_dict())
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=LEARNING_RATE)


def _make(spec, config, role_index: int, seed: int, init_seed: int, ranks=None) -> ToyReinforceLearner:
    return ToyReinforceLearner(spec, config.role_net(role_index), seed, init_seed)


def _validate(config) -> None:
    if config.game != "tic_tac_toe":
        raise ConfigError(f"learner {NAME!r} plays tic_tac_toe only, not {config.game!r}")


def register() -> LearnerKind:
    """The toy kind, registered once per process."""
    for kind in learner_kinds():
        if kind.name == NAME:
            return kind
    return register_learner_kind(LearnerKind(
        NAME, "REINFORCE with plain SGD on an actor-critic net (a test's toy)", ("net",),
        make=_make, architecture=lambda config: ActorCriticArchitecture(config.net), validate=_validate,
        uses_net=True))
