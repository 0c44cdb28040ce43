"""The league's first members: fixed anchors (bots or imported snapshots) and seeded snapshots.

`seed_population` entries are snapshot directories or whole run directories (every snapshot at
that run's latest checkpoint joins), so a new league can start from an old one's population.
"""

from __future__ import annotations

import os
from pathlib import Path

from ludus.games.core import GameSpec
from ludus.league.checkpoint import RunError, checkpoint_directory, read_checkpoint
from ludus.league.config import LeagueConfig
from ludus.league.records.population import Member


def founding_members(config: LeagueConfig, spec: GameSpec) -> list[Member]:
    """Anchors, then seeded snapshots, in the order they join (a member imported twice joins once)."""
    members: dict[str, Member] = {}
    for name in config.anchors:
        if name == BASE_ANCHOR:
            continue  # the untrained base LM: joins with the learners' first snapshot (`base_anchor`)
        if os.path.isdir(name):
            member = imported_snapshot(name, "anchor", spec)
        else:
            from ludus.agents.bots.builtin import make_bot

            make_bot(name, spec)  # refuse a bad bot name now
            member = Member(f"anchor:{name}", "anchor", "anchor", bot=name)
        members.setdefault(member.player_id, member)
    for source in config.seed_population:
        for member in _seeded(Path(source), spec):
            members.setdefault(member.player_id, member)
    return list(members.values())


BASE_ANCHOR = "base"
"""Anchor name of the untrained base LM (learners 'text_ppo', 'text_mmd', 'text_exit'): adapters at zero are the
base itself."""


def base_anchor(first_snapshot: Member) -> Member:
    """`anchor:base`: a rated, never-trained copy of the LM learners' starting point. The first
    snapshot of an LM learner is its initial adapters, which are zero (LoRA's B = 0), so that
    snapshot plays exactly as the base model; the anchor plays the same files under its own id."""
    return Member(f"anchor:{BASE_ANCHOR}", "snapshot", "anchor", snapshot_path=first_snapshot.snapshot_path,
                  snapshot_id=first_snapshot.snapshot_id)


def imported_snapshot(path: str | os.PathLike, role: str, spec: GameSpec) -> Member:
    from ludus.agents.snapshot import load_snapshot

    loaded = load_snapshot(path, expect_game=spec.id)
    return Member(f"{role}:{loaded.ref.snapshot_id[:12]}", "snapshot", role,
                  snapshot_path=str(Path(path).resolve()), snapshot_id=loaded.ref.snapshot_id)


def _seeded(path: Path, spec: GameSpec) -> list[Member]:
    if (path / "manifest.json").is_file():
        return [imported_snapshot(path, "seed", spec)]
    try:
        state = read_checkpoint(checkpoint_directory(path))
    except RunError:
        raise RunError(f"seed_population entry {str(path)!r} is neither a snapshot nor a run directory") from None
    out = []
    for member in state.population.snapshots():
        snapshot = Path(member.snapshot_path)
        out.append(imported_snapshot(snapshot if snapshot.is_absolute() else path / snapshot, "seed", spec))
    return out
