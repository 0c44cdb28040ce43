"""A mixture checkpoint: a league's output policy as a weighted set of frozen policies.

PSRO's output is not one network but the meta-Nash mixture over the population (Lanctot et al.
2017, Algorithm 1): "draw member k with probability w_k, then play it for the whole game". A
mixture directory holds ``mixture.json``:

    {"format": "ludus-mixture", "format_version": 1, "game_id": "spiel:kuhn_poker",
     "source": "meta-Nash of the exact PSRO meta-game", "iteration": 40,
     "components": [{"player_id": "main@3", "weight": 0.7, "snapshot": "../snapshots/main@3",
                     "snapshot_id": "9f2c..."},
                    {"player_id": "random", "weight": 0.3, "bot": "random"}]}

A component is a snapshot directory (a path relative to the mixture directory, checked against
the content hash `snapshot_id` when read) or a built-in bot named by id; nothing else is loaded.
A league writes ``<run>/output_policy/`` (`OUTPUT_POLICY_DIR`) at every population change
(league/output.py, with paths into the run); ``ludus export`` copies the members in, so the
folder stands alone.

Play samples one component per game (`MixturePolicy.start_game`); exact tools (exploitability)
aggregate the components' tabular policies reach-weighted (`ludus.agents.solvers.exploitability`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ludus.errors import UserError
from ludus.files import atomic_write_json

MIXTURE_FILE = "mixture.json"
OUTPUT_POLICY_DIR = "output_policy"
"""Where a league run keeps its output policy (league/output.py), inside the run directory."""
FORMAT = "ludus-mixture"
FORMAT_VERSION = 1
MAX_MIXTURE_BYTES = 1 << 20


class MixtureError(UserError):
    """A mixture directory that is missing, malformed, or names members that do not check out."""


@dataclass(frozen=True)
class MixtureComponent:
    """One member of a mixture and its probability."""

    player_id: str
    """The member's player id in the league it came from (e.g. ``main@3``, ``random``)."""
    weight: float
    """Probability of playing this member for a whole game; the weights sum to 1."""
    snapshot: str | None = None
    """Snapshot directory, relative to the mixture directory (None for a bot)."""
    snapshot_id: str | None = None
    """Content hash the snapshot must have (`ludus.agents.snapshot.verify_snapshot`)."""
    bot: str | None = None
    """Built-in bot id (`ludus.agents.bots.builtin.make_bot`) when the member is a bot."""


@dataclass(frozen=True)
class Mixture:
    """A mixture checkpoint (see the module docstring)."""

    game_id: str
    """The game every component plays."""
    components: tuple[MixtureComponent, ...]
    """Members with positive weight, in population order."""
    source: str
    """How the weights were chosen (e.g. the PSRO meta-Nash, or the main agent's newest snapshot)."""
    iteration: int
    """League iteration at which the mixture was written."""

    def to_json(self) -> dict:
        components = []
        for c in self.components:
            entry: dict = {"player_id": c.player_id, "weight": c.weight}
            if c.bot is not None:
                entry["bot"] = c.bot
            else:
                entry.update(snapshot=c.snapshot, snapshot_id=c.snapshot_id)
            components.append(entry)
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "game_id": self.game_id,
                "source": self.source, "iteration": self.iteration, "components": components}


def is_run_directory(path: str | os.PathLike) -> bool:
    """Whether `path` is a league run directory (it holds the checkpoint pointer)."""
    return os.path.isfile(os.path.join(path, "checkpoint.json"))


def newest_run_snapshot(run_dir: str | os.PathLike) -> str:
    """The newest snapshot of a league run's first role (usually 'main'), read from the run's last
    checkpoint (config.json, checkpoint.json -> checkpoints/iter-N/state.json: JSON only)."""
    run = Path(run_dir)
    try:
        config = json.loads((run / "config.json").read_text())
        pointer = json.loads((run / "checkpoint.json").read_text())
        state = json.loads((run / pointer["path"] / "state.json").read_text())
        role = config["roles"][0]["name"]
        snapshots = [m for m in state["population"] if m["kind"] == "snapshot" and m["role"] == role]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise MixtureError(f"cannot read the league run {run}: {exc}; give a snapshot directory instead") from None
    if not snapshots:
        raise MixtureError(f"the league run {run} has no snapshot of {role!r} yet: train it longer")
    path = Path(snapshots[-1]["snapshot_path"])
    return str(path if path.is_absolute() else run / path)


def run_checkpoint(path: str | os.PathLike) -> str:
    """What a path names as a checkpoint: a league run directory stands for its output policy
    (`OUTPUT_POLICY_DIR`; before its first population change, its newest main snapshot), any
    other path for itself."""
    text = os.fspath(path)
    if not is_run_directory(text):
        return text
    output = os.path.join(text, OUTPUT_POLICY_DIR)
    return output if is_mixture(output) else newest_run_snapshot(text)


def is_mixture(path: str | os.PathLike) -> bool:
    """Whether `path` is a mixture directory (holds ``mixture.json``)."""
    return (Path(path) / MIXTURE_FILE).is_file()


def write_mixture(directory: str | os.PathLike, mixture: Mixture) -> Path:
    """Write ``<directory>/mixture.json`` atomically (a reader never sees half a file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(directory / MIXTURE_FILE, mixture.to_json())
    return directory / MIXTURE_FILE


def read_mixture(directory: str | os.PathLike, verify: bool = True) -> Mixture:
    """Read and check a mixture directory; `verify` also checks every snapshot's content hash.

    Raises MixtureError with a one-line message naming the problem."""
    directory = Path(directory)
    path = directory / MIXTURE_FILE
    try:
        raw = path.read_bytes()[:MAX_MIXTURE_BYTES + 1]
    except OSError as exc:
        raise MixtureError(f"{directory}: no readable {MIXTURE_FILE} ({exc.strerror or exc})") from None
    if len(raw) > MAX_MIXTURE_BYTES:
        raise MixtureError(f"{path}: larger than {MAX_MIXTURE_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MixtureError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
        raise MixtureError(f"{path}: not a {FORMAT} file of format_version {FORMAT_VERSION}")
    game_id, entries = data.get("game_id"), data.get("components")
    if not isinstance(game_id, str) or not isinstance(entries, list) or not entries:
        raise MixtureError(f"{path}: needs a game_id and a non-empty list of components")
    components = tuple(_component(entry, path) for entry in entries)
    total = sum(c.weight for c in components)
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise MixtureError(f"{path}: the weights sum to {total:.6f}, not 1")
    if verify:
        from ludus.agents.snapshot import SnapshotError, verify_snapshot  # torch: only when checking

        for c in components:
            if c.snapshot is None:
                continue
            try:
                ref = verify_snapshot(directory / c.snapshot)
            except SnapshotError as exc:
                raise MixtureError(f"{path}: component {c.player_id!r}: {exc}") from None
            if ref.snapshot_id != c.snapshot_id:
                raise MixtureError(f"{path}: component {c.player_id!r} at {c.snapshot} has content "
                                   f"{ref.snapshot_id[:12]}, not the recorded {str(c.snapshot_id)[:12]}")
    source, iteration = data.get("source", ""), data.get("iteration", 0)
    return Mixture(game_id, components, str(source), int(iteration) if isinstance(iteration, int) else 0)


def _component(entry: object, path: Path) -> MixtureComponent:
    if not isinstance(entry, dict) or not isinstance(entry.get("player_id"), str):
        raise MixtureError(f"{path}: every component is an object with a player_id")
    name, weight = entry["player_id"], entry.get("weight")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 < weight <= 1.0:
        raise MixtureError(f"{path}: component {name!r} needs a weight in (0, 1], got {weight!r}")
    bot, snapshot, snapshot_id = entry.get("bot"), entry.get("snapshot"), entry.get("snapshot_id")
    if (bot is None) == (snapshot is None):
        raise MixtureError(f"{path}: component {name!r} names exactly one of 'bot' and 'snapshot'")
    if bot is not None and not isinstance(bot, str):
        raise MixtureError(f"{path}: component {name!r}: bot must be a bot id")
    if snapshot is not None and (not isinstance(snapshot, str) or not isinstance(snapshot_id, str)
                                 or os.path.isabs(snapshot)):
        raise MixtureError(f"{path}: component {name!r}: snapshot must be a relative path with its snapshot_id")
    return MixtureComponent(name, float(weight), snapshot, snapshot_id, bot)


def component_paths(directory: str | os.PathLike, mixture: Mixture) -> list[str | None]:
    """Each component's snapshot directory as a path (None for bots)."""
    return [None if c.snapshot is None else os.path.normpath(Path(directory) / c.snapshot) for c in mixture.components]


class MixturePolicy:
    """Plays a mixture: at the start of each game one component is drawn by weight and plays it
    whole. A policy for one game at a time (the arena's agent host, ``ludus play``); callers
    that batch many games evaluate the components one by one and weight the results."""

    def __init__(self, mixture: Mixture, policies: list):
        self.mixture = mixture
        self.policies = policies
        self.weights = np.array([c.weight for c in mixture.components], dtype=np.float64)
        self.weights /= self.weights.sum()
        self.current = policies[0]
        self.needs_history = any(getattr(p, "needs_history", False) for p in policies)

    def start_game(self, rng: np.random.Generator) -> str:
        """Draw the component that plays the next game; returns its player id."""
        index = int(rng.choice(len(self.policies), p=self.weights))
        self.current = self.policies[index]
        return self.mixture.components[index].player_id

    def act(self, batch, rng: np.random.Generator, greedy: bool = False):
        return self.current.act(batch, rng, greedy=greedy)

    def forget_readings(self) -> None:
        """`ludus.agents.policy.KeepsReadings`: every component that keeps readings (an LM) forgets them."""
        from ludus.agents.policy import KeepsReadings

        for policy in self.policies:
            if isinstance(policy, KeepsReadings):
                policy.forget_readings()


def load_mixture_policy(directory: str | os.PathLike, expect_game: str | None = None) -> MixturePolicy:
    """The playable policy of a mixture directory (snapshots verified, bots by trusted id)."""
    from ludus.agents.bots.builtin import make_bot
    from ludus.agents.snapshot import policy_from_snapshot
    from ludus.games import registry

    mixture = read_mixture(directory)
    if expect_game is not None and mixture.game_id != expect_game:
        raise MixtureError(f"{directory}: the mixture plays {mixture.game_id}, not {expect_game}")
    spec = registry.spec(mixture.game_id)
    policies = [make_bot(c.bot, spec) if path is None else policy_from_snapshot(path, expect_game=mixture.game_id)
                for c, path in zip(mixture.components, component_paths(directory, mixture))]
    return MixturePolicy(mixture, policies)
