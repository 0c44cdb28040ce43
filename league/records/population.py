"""The league's population: learners, frozen snapshots and fixed anchors, with roles as data.

Frozen members are loaded lazily through an LRU cache (`PolicyCache`), so a population of
hundreds of snapshots costs only the memory of the few being played.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable, Literal

from ludus.agents.policy import Policy
from ludus.games.core import GameSpec
from ludus.errors import UserError

MemberKind = Literal["learner", "snapshot", "anchor"]


@dataclass(frozen=True)
class Member:
    """One player of the league."""

    player_id: str
    """Unique id: a learner's role name ('main'), a snapshot ('main@3'), an anchor ('anchor:random')."""
    kind: MemberKind
    """'learner' (trained live; never rated), 'snapshot' (frozen weights) or 'anchor' (a fixed bot)."""
    role: str
    """The role that produced it ('main', 'main_exploiter', ...), 'anchor', or 'seed' for imported members."""
    snapshot_path: str | None = None
    """Snapshot directory (kind 'snapshot')."""
    snapshot_id: str | None = None
    """Content hash of the snapshot."""
    bot: str | None = None
    """Bot name (kind 'anchor'), e.g. 'random' or 'mcts-25'."""
    parent: str | None = None
    """player_id this member was frozen from (lineage)."""
    iteration: int = 0
    """League iteration at which it joined."""
    steps: int = 0
    """Learner env steps at the time it was frozen."""

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict) -> "Member":
        return Member(**data)


class Population:
    """Members in the order they joined (that order is part of the run's determinism)."""

    def __init__(self, members: Iterable[Member] = ()):
        self._members: dict[str, Member] = {}
        for member in members:
            self.add(member)

    def add(self, member: Member) -> None:
        if member.player_id in self._members:
            raise ValueError(f"player {member.player_id!r} is already in the population")
        self._members[member.player_id] = member

    def __contains__(self, player_id: str) -> bool:
        return player_id in self._members

    def __getitem__(self, player_id: str) -> Member:
        return self._members[player_id]

    def __len__(self) -> int:
        return len(self._members)

    def members(self) -> list[Member]:
        return list(self._members.values())

    def frozen(self) -> list[Member]:
        """Snapshots and anchors: the players that rating matches are between."""
        return [m for m in self._members.values() if m.kind != "learner"]

    def snapshots(self, role: str | None = None) -> list[Member]:
        return [m for m in self._members.values()
                if m.kind == "snapshot" and (role is None or m.role == role)]

    def learners(self) -> list[Member]:
        return [m for m in self._members.values() if m.kind == "learner"]

    def to_json(self) -> list[dict]:
        return [m.to_json() for m in self._members.values()]

    @staticmethod
    def from_json(data: list[dict]) -> "Population":
        return Population(Member.from_json(d) for d in data)


def with_absolute_paths(members: Iterable[Member], run_dir: str | os.PathLike) -> list[Member]:
    """The members with snapshot paths made absolute (a run stores its own ones relative to its
    directory; runners, readers and evaluators may work from anywhere)."""
    run_dir = os.path.abspath(run_dir)  # a relative run directory would be joined twice by readers
    return [replace(m, snapshot_path=os.path.join(run_dir, m.snapshot_path))
            if m.snapshot_path and not os.path.isabs(m.snapshot_path) else m for m in members]


def load_member_policy(member: Member, spec: GameSpec, lm_base: Any | None = None) -> Policy:
    """Build the policy of a frozen member (snapshot weights or anchor bot). `lm_base`: the
    `PretrainedLMConfig` the league's LM snapshots are loaded onto (the operator's base)."""
    if member.kind == "anchor":
        from ludus.agents.bots.builtin import make_bot

        return make_bot(member.bot or "", spec)
    if member.kind == "snapshot":
        from ludus.agents.snapshot import policy_from_snapshot

        from ludus.agents.torch_policy import TorchPolicy

        policy = policy_from_snapshot(member.snapshot_path, expect_game=spec.id, lm_base=lm_base)
        if isinstance(policy, TorchPolicy):
            policy.compute_values = False  # a frozen member's values are never used
        return policy
    raise UserError(f"player {member.player_id!r} is a live learner, not a frozen member")


class PolicyCache:
    """LRU cache of frozen members' policies, loaded on first use."""

    def __init__(self, load: Callable[[str], Policy], capacity: int):
        if capacity < 1:
            raise ValueError("policy cache capacity must be >= 1")
        self._load = load
        self.capacity = capacity
        self._cache: OrderedDict[str, Policy] = OrderedDict()
        self.loads = 0

    def get(self, player_id: str) -> Policy:
        policy = self._cache.get(player_id)
        if policy is not None:
            self._cache.move_to_end(player_id)
            return policy
        policy = self._load(player_id)
        self.loads += 1
        self._cache[player_id] = policy
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return policy

    def __len__(self) -> int:
        return len(self._cache)
