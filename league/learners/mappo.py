"""MAPPO in the league (Yu et al. 2022): a side's shared actor, trained against the rated
population with a centralised critic; 'ippo' is the same learner with a local critic.

The actor is the league's ordinary actor-critic net (`net`), so a MAPPO side freezes into the
same snapshots as a PPO learner and plays anywhere they do (opponent pools, evaluation, the
arena, `ludus play`); its own value head is left untrained. The critic is a separate MLP
(`critic`) over what the runner records for every row the side plays: the game's global state,
or the side's joint observation when the game has none (`ludus.agents.rollout.side_critic_inputs`),
plus the seat's one-hot id. Runners receive actor, critic and value statistics together
(`MAPPOModule`), so the values stored with each row — GAE's baseline and the clipping anchor —
are the centralised critic's, in return units. The update is `ludus.agents.rl.mappo.MAPPOLearner.update`:
PPO's one loss (agents/ppo_core.py) on the actor, a Huber, clipped value loss on normalised
returns for the critic, each with its own Adam.

Seats that leave a game while their side plays on simply stop producing rows (a row exists only
where a seat acted), so they carry no actor or critic loss: the flat-row form of MAPPO's active
masks. Their last transition collects the rewards until the game ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ludus.agents.rl.mappo import (CentralisedCriticPolicy, MAPPOBatch, MAPPOConfig, MAPPOCritic, MAPPOLearner, MAPPOModule,
                          ValueNorm, critic_rows, input_sizes)
from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.policy import Policy
from ludus.agents.rollout import RolloutBatch
from ludus.agents.snapshot import Lineage, SnapshotRef
from ludus.games.core import GameSpec


MAPPO_FROM_PPO = {"actor_learning_rate": "learning_rate", "anneal_lr": "anneal_lr", "adam_eps": "adam_eps",
                  "gamma": "gamma", "gae_lambda": "gae_lambda", "clip_coef": "clip_coef",
                  "update_epochs": "update_epochs", "num_minibatches": "num_minibatches", "ent_coef": "ent_coef",
                  "clip_value_loss": "clip_vloss", "max_grad_norm": "max_grad_norm"}
"""`MAPPOConfig` fields taken from the league's `ppo.*` keys (MAPPO field -> PPO key)."""

PPO_KEYS_MAPPO_READS = frozenset(MAPPO_FROM_PPO.values())
"""The `ppo.*` keys that `mappo_config` passes on; the league config refuses the others when set."""


def mappo_config(config: Any, critic_input: str = "global") -> MAPPOConfig:
    """The `MAPPOConfig` of a league config's learner 'mappo' (`critic_input` 'global') / 'ippo'
    ('local': league/learners/kinds.py passes it): PPO's shared settings from `config.ppo`
    (`MAPPO_FROM_PPO`), the critic's from `config.critic`."""
    ppo, critic = config.ppo, config.critic
    return MAPPOConfig(
        critic_input=critic_input,
        **{field: getattr(ppo, key) for field, key in MAPPO_FROM_PPO.items()},
        critic_learning_rate=critic.learning_rate, value_loss_coef=1.0,
        use_huber_loss=critic.huber_delta is not None,
        huber_delta=critic.huber_delta if critic.huber_delta is not None else 10.0,
        use_value_norm=critic.value_norm, hidden=critic.hidden, critic_agent_id=critic.agent_id,
        critic_own_observation=critic.own_observation, actor_agent_id=False)


@dataclass(frozen=True)
class MAPPOArchitecture:
    """A MAPPO side at play in a runner: the actor net, the critic and the value statistics."""

    net: NetConfig
    mappo: MAPPOConfig
    lm_base = None

    def build(self, spec: GameSpec) -> tuple[nn.Module, Policy]:
        module = MAPPOModule(ActorCritic(spec, self.net), MAPPOCritic(input_sizes(spec, self.mappo)[1], self.mappo),
                             ValueNorm(self.mappo.value_norm_beta) if self.mappo.use_value_norm else None)
        return module, CentralisedCriticPolicy(module, self.mappo, spec.num_players)


class MAPPOLeagueLearner:
    """A `ludus.league.learners.base.LeagueLearner`: one role's side, MAPPO (or IPPO) updates."""

    def __init__(self, spec: GameSpec, config: Any, net: NetConfig, seed: int, init_seed: int,
                 critic_input: str = "global"):
        """`net`: the actor's architecture (the role's, `LeagueConfig.role_net`); `critic_input`:
        'global' (MAPPO) or 'local' (IPPO)."""
        self.spec = spec
        self.net_config = net
        self.mappo = mappo_config(config, critic_input)
        self.architecture = MAPPOArchitecture(net, self.mappo)
        self.learner = self._new_learner(seed, init_seed, actor_state=None)

    def _new_learner(self, seed: int, init_seed: int, actor_state: dict[str, torch.Tensor] | None) -> MAPPOLearner:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)  # initial weights; torch's global generator is left as it was
            module, _ = self.architecture.build(self.spec)
        if actor_state is not None:
            module.actor.net.load_state_dict(actor_state)
        self.module = module
        return MAPPOLearner(module.actor, module.critic, self.mappo, seed, value_norm=module.value_norm)

    @property
    def updates(self) -> int:
        return self.learner.updates

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        if self.mappo.anneal_lr:
            self.learner.set_learning_rate_fraction(1.0 - progress)
        rows = len(batch)
        critic_in = critic_rows(batch.obs, batch.critic_obs, batch.seats, self.mappo, self.spec.num_players)
        stats = self.learner.update(MAPPOBatch(
            actor_obs=np.asarray(batch.obs, dtype=np.float32), critic_obs=critic_in, mask=batch.mask,
            actions=batch.actions, logprobs=batch.logprobs, values=batch.values, rewards=batch.rewards,
            advantages=batch.advantages, returns=batch.returns, active=np.ones(rows, dtype=np.float32),
            seats=batch.seats))
        return {k: float(v) for k, v in stats.__dict__.items() if isinstance(v, (int, float))}

    def freeze(self, directory: Path, lineage: Lineage) -> SnapshotRef:
        from ludus.agents.snapshot import save_snapshot

        return save_snapshot(self.module.actor.net, self.spec, self.net_config, directory, lineage)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.learner.load_state_dict(state)

    def reset_to(self, snapshot: Path, seed: int) -> None:
        """The snapshot's actor, a fresh critic and optimizers (AlphaStar's exploiter reset)."""
        from ludus.agents.snapshot import load_snapshot

        actor = load_snapshot(snapshot, expect_game=self.spec.id).net.state_dict()
        updates = self.learner.updates
        self.learner = self._new_learner(seed, seed, actor_state=actor)
        self.learner.updates = updates  # versions keep increasing: runners key weights by version
