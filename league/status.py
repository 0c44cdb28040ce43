"""`ludus status`: a run's population table, read-only, without importing torch.

Only the run directory's JSON files and the ledger are read (league/rundata.py, league/records/ledger.py),
and the ledger's per-player sums are computed by SQLite, so the table answers quickly while the
run trains.

The headline figures are in the table: each member's recent score against each anchor bot (a
column per anchor: how good it is against fixed yardsticks, which one overall score over a
changing population hides; a live learner's from the checkpoint's payoff table, every other
member's from the anchor's newest matches in the ledger, not a ledger scan), and, for a run that
measures it (small OpenSpiel games with an averaged or PSRO output policy;
`ludus.evaluation.league_hooks`), the output policy's latest exploitability.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ludus.games.mix import mix_parts
from ludus.league.checkpoint import CHECKPOINT_POINTER, STATE_FILE
from ludus.league.records.ledger import Store
from ludus.league.rundata import read_run


@dataclass(frozen=True)
class MemberStatus:
    """One row of the population table."""

    player_id: str
    kind: str
    role: str
    mu: float | None
    sigma: float | None
    games: int
    score: float | None
    """Mean outcome (win 1, draw .5) over all its recorded games."""
    parent: str | None
    iteration: int
    recent_return: float | None = None
    """Mean episode return over its last `RECENT_GAMES` games (what a one-player game is judged by)."""
    recent_length: float | None = None
    """Mean length (steps) of those games."""
    invalid_answers: float | None = None
    """Text agents: its answers that did not count, per turn, over its last `RECENT_GAMES` games
    (each retried answer and each move the game refused counts, so a turn that failed three times
    counts 3; 0 when every first answer counted); None for agents that play by actions."""
    vs_anchors: tuple[tuple[str, float, float | None], ...] = ()
    """(anchor, games, score) against each anchor of the run, in `StatusReport.anchors` order: win 1,
    draw .5; a live learner's over its recent games with it (decayed counts of the league's payoff
    table; see `anchor_scores`), any other member's over its games among the anchor's newest
    `ANCHOR_RECENT_MATCHES` matches in the ledger; None if they never met."""

    @property
    def conservative(self) -> float | None:
        return None if self.mu is None else self.mu - 3 * self.sigma


@dataclass(frozen=True)
class GameMemberStatus:
    """One member's figures in one game of a run of several games."""

    player_id: str
    mu: float | None
    """TrueSkill from this game's rating matches alone (None: it played none)."""
    sigma: float | None
    games: int
    """Its matches of this game, training and rating."""
    score: float | None
    """Mean outcome (win 1, draw .5) over them."""
    invalid_answers: float | None
    """Text agents: its answers in this game that did not count, per turn (retries and refused moves)."""

    @property
    def conservative(self) -> float | None:
        return None if self.mu is None else self.mu - 3 * self.sigma


@dataclass(frozen=True)
class GameStatus:
    """A run of several games (config key `games`): one game's matches, ratings and answer rates."""

    game: str
    matches: int
    members: tuple[GameMemberStatus, ...]
    """The members that played it, best conservative rating first."""


def game_statuses(store: Store, run_game: str) -> tuple[GameStatus, ...]:
    """Per game of a run of several games (`run_game` a mix id; () for a run of one game):
    TrueSkill rebuilt from that game's rating matches (the same updates, in ledger order, a live
    table of that game would make), each member's games, score and invalid answers per turn. A scan
    of the ledger: a run of several games is an LM run, whose ledgers hold thousands of matches,
    not millions."""
    from ludus.league.records.ratings import RatingTable, TrueSkillParams, load_params

    game_ids = [p.game_id for p in mix_parts(run_game)]
    if not game_ids:
        return ()
    params = load_params(store)
    tables = {g: RatingTable(params or TrueSkillParams()) for g in game_ids}
    counts = {g: {} for g in game_ids}
    matches = dict.fromkeys(game_ids, 0)
    for recorded in store.iter_matches():
        match = recorded.result
        if match.game_id not in counts:
            continue
        matches[match.game_id] += 1
        if match.kind == "rating":
            tables[match.game_id].update(match)
        seen = set()
        for seat in match.seats:
            row = counts[match.game_id].setdefault(seat.player_id, [0, 0.0, 0, 0])
            if seat.player_id not in seen:  # a player's seats in one match (self-play, a team) are one game
                seen.add(seat.player_id)
                row[0] += 1
                row[1] += seat.outcome
            row[2] += int(seat.metadata.get("turns", 0))
            row[3] += int(seat.metadata.get("invalid", 0))
    out = []
    for game in game_ids:
        rated = tables[game].as_dict()
        members = [GameMemberStatus(pid, rated[pid].mu if pid in rated else None,
                                    rated[pid].sigma if pid in rated else None, n, total / n,
                                    invalid / turns if turns else None)
                   for pid, (n, total, turns, invalid) in counts[game].items()]
        members.sort(key=lambda m: (m.conservative is None, -(m.conservative or 0.0), m.player_id))
        out.append(GameStatus(game, matches[game], tuple(members)))
    return tuple(out)


@dataclass(frozen=True)
class StatusReport:
    """What `ludus status` shows."""

    run_dir: str
    game: str
    iteration: int
    iterations: int
    total_matches: int
    total_env_steps: int
    members: tuple[MemberStatus, ...]
    anchors: tuple[str, ...] = ()
    """Player ids of the run's anchors: the `vs <anchor>` columns."""
    exploitability: float | None = None
    """The output policy's latest exploitability (``eval/exploitability`` in metrics.jsonl), if logged."""
    exploitability_step: float | None = None
    """Env steps at which it was measured."""
    target_exploitability: float | None = None
    """For a learner that trains towards an exact table (text_mmd on a small poker game): that
    table's latest exploitability (``losses/<main>/table_exploitability``), the headline such a
    run reports while it trains; the LM's own is `ludus evaluate RUN --exploitability`."""
    games: tuple[GameStatus, ...] = ()
    """A run of several games: each game's own table (`game_statuses`); empty otherwise."""

    def to_json(self) -> dict:
        return {
            "run_dir": self.run_dir, "game": self.game, "iteration": self.iteration,
            "iterations": self.iterations, "total_matches": self.total_matches,
            "total_env_steps": self.total_env_steps, "anchors": list(self.anchors),
            "exploitability": self.exploitability, "exploitability_step": self.exploitability_step,
            "target_exploitability": self.target_exploitability,
            "games": [{"game": g.game, "matches": g.matches,
                       "members": [{**m.__dict__, "conservative": m.conservative} for m in g.members]}
                      for g in self.games],
            "members": [{**m.__dict__, "conservative": m.conservative,
                         "vs_anchors": {a: {"games": n, "score": v} for a, n, v in m.vs_anchors}}
                        for m in self.members],
        }


RECENT_GAMES = 100
ANCHOR_RECENT_MATCHES = 10_000
"""A member that is not a live learner is scored against an anchor over the anchor's newest this
many matches in the ledger (an index range read: quick on a ledger of any size)."""
EXPLOITABILITY_KEY = "eval/exploitability"
TAIL_BYTES = 1 << 22
"""How much of metrics.jsonl's end is searched for the latest exploitability (4 MiB, newest first)."""


def anchor_scores(run_dir: Path, players: list[str], anchors: list[str]) -> dict[tuple[str, str], tuple[float, float]]:
    """(player, anchor) -> (games, score) from the league's payoff table in the checkpoint: decayed
    counts of the pair's recent games (about the last 1 / (1 - payoff_decay), training and rating
    matches), exactly what the league logs as ``eval/win_rate_vs_<anchor>`` for its main learner.
    A lookup, not a ledger scan: joining every anchor seat of a 600,000-match ledger takes ~2 s
    here, and the table's window is the one the return and length columns show too. Empty when
    the checkpoint cannot be read (being replaced: the next call reads the new one)."""
    from ludus.league.records.payoff import PayoffTable

    if not anchors:
        return {}
    try:
        pointer = json.loads((run_dir / CHECKPOINT_POINTER).read_text())
        table = PayoffTable.from_json(json.loads((run_dir / pointer["path"] / STATE_FILE).read_text())["payoff"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    out = {}
    for player in players:
        for anchor in anchors:
            wins, draws, games = table.counts(player, anchor)
            if games > 0 and player != anchor:
                out[(player, anchor)] = (games, (wins + draws / 2) / games)
    return out


def latest_metric(path: Path, key: str, tail_bytes: int = TAIL_BYTES) -> tuple[float, float] | None:
    """(value, step) of the newest metrics.jsonl record holding `key`, read from the file's end
    (at most `tail_bytes`), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            data = f.read()
    except FileNotFoundError:
        return None
    needle = f'"{key}"'.encode()
    for line in reversed(data.split(b"\n")):
        if needle in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written, or cut by the tail's start
            if key in record:
                return float(record[key]), float(record.get("step", 0.0))
    return None


def _measures_exploitability(config) -> bool:
    """Whether the run's config logs the output policy's exploitability (an averaged or PSRO output)."""
    return (config.get("output_policy") in ("average", "uniform_average")
            or any(float(role.get("meta_nash", 0) or 0) > 0 for role in config.get("roles", ()) or ()))


def status(run_dir: str | Path) -> StatusReport:
    """The population table, read-only (works while the run trains)."""
    run = read_run(Path(run_dir))
    anchors = [m.player_id for m in run.members if m.kind == "anchor"]
    with Store.open(run.run_dir, mode="read") as store:
        latest = store.latest_ratings()
        played = store.player_games(RECENT_GAMES)  # a team's seats share one policy: one game, one outcome
        # the payoff table counts only a live learner's training games: every other member's
        # score against an anchor comes from the anchor's newest rating matches in the ledger
        met = {a: store.head_to_head(a, ANCHOR_RECENT_MATCHES) for a in anchors}
        per_game = game_statuses(store, run.game_id)
    versus = anchor_scores(run.run_dir, [m.player_id for m in run.members], anchors)
    for anchor, opponents in met.items():
        for player, (games, total) in opponents.items():
            versus.setdefault((player, anchor), (float(games), total / games))
    members = []
    for m in run.members:
        r = latest.get(m.player_id)
        g = played.get(m.player_id)
        vs = tuple((a, *versus.get((m.player_id, a), (0.0, None))) for a in anchors)
        invalid = g.recent_invalid / g.recent_turns if g and g.recent_turns else None
        members.append(MemberStatus(m.player_id, m.kind, m.role, r.mu if r else None, r.sigma if r else None,
                                    g.games if g else 0, g.score / g.games if g else None, m.parent, m.iteration,
                                    g.recent_return if g else None, g.recent_length if g else None, invalid, vs))
    members.sort(key=lambda m: (m.conservative is None, -(m.conservative or 0.0), m.player_id))
    found = latest_metric(run.run_dir / "metrics.jsonl", EXPLOITABILITY_KEY) if _measures_exploitability(run.config) \
        else None
    roles = run.config.get("roles") or [{}]
    target = None
    if found is None and isinstance(roles[0], dict) and roles[0].get("name"):
        target = latest_metric(run.run_dir / "metrics.jsonl", f"losses/{roles[0]['name']}/table_exploitability")
    return StatusReport(str(run_dir), run.game_id, run.iteration, run.config["iterations"], run.total_matches,
                        run.total_env_steps, tuple(members), tuple(anchors),
                        None if found is None else found[0], None if found is None else found[1],
                        None if target is None else target[0], per_game)


def anchor_label(player_id: str) -> str:
    """Column title of an anchor: ``vs random`` for ``anchor:random``."""
    return "vs " + player_id.split(":", 1)[-1]


def format_status(report: StatusReport) -> str:
    """The run line (with the output policy's exploitability where logged), the column titles,
    one row per member (its score against each anchor in a column of its own), and a note."""
    exploit = ("" if report.exploitability is None else
               f"  output-policy exploitability {report.exploitability:.4g} (at {report.exploitability_step:,.0f} "
               f"env steps)")
    if report.target_exploitability is not None:
        exploit += (f"  learner's target exploitability {report.target_exploitability:.4g} (the LM's own: "
                    f"ludus evaluate RUN --exploitability)")
    labels = [anchor_label(a) for a in report.anchors]
    widths = [max(len(label), 6) for label in labels]
    texts = any(m.invalid_answers is not None for m in report.members)  # an 'invalid' column for text agents
    lines = [f"run {report.run_dir}  game {report.game}  iteration {report.iteration}/{report.iterations}  "
             f"matches {report.total_matches:,}  env steps {report.total_env_steps:,}{exploit}",
             f"{'player':<24} {'kind':<9} {'role':<17} {'mu':>7} {'sigma':>6} {'mu-3s':>7} {'games':>7} {'score':>6} "
             + "".join(f"{label:>{w}} " for label, w in zip(labels, widths)) + f"{'return':>9} {'length':>7}"
             + (f" {'invalid':>7}" if texts else "")]
    for m in report.members:
        mu = f"{m.mu:7.2f}" if m.mu is not None else f"{'-':>7}"
        sigma = f"{m.sigma:6.2f}" if m.sigma is not None else f"{'-':>6}"
        cons = f"{m.conservative:7.2f}" if m.conservative is not None else f"{'-':>7}"
        score = f"{m.score:6.3f}" if m.score is not None else f"{'-':>6}"
        vs = dict((a, v) for a, _, v in m.vs_anchors)
        cells = "".join((f"{vs[a]:>{w}.3f} " if vs.get(a) is not None else f"{'-':>{w}} ")
                        for a, w in zip(report.anchors, widths))
        ret = f"{m.recent_return:9.3g}" if m.recent_return is not None else f"{'-':>9}"
        length = f"{m.recent_length:7.1f}" if m.recent_length is not None else f"{'-':>7}"
        invalid = "" if not texts else (f" {m.invalid_answers:7.2f}" if m.invalid_answers is not None else f" {'-':>7}")
        lines.append(f"{m.player_id:<24} {m.kind:<9} {m.role:<17} {mu} {sigma} {cons} {m.games:>7} {score} {cells}"
                     f"{ret} {length}{invalid}")
    for game in report.games:
        lines.append(f"game {game.game}: {game.matches:,} matches")
        for m in game.members:
            mu = f"{m.mu:7.2f}" if m.mu is not None else f"{'-':>7}"
            sigma = f"{m.sigma:6.2f}" if m.sigma is not None else f"{'-':>6}"
            cons = f"{m.conservative:7.2f}" if m.conservative is not None else f"{'-':>7}"
            invalid = f" {m.invalid_answers:7.2f}" if m.invalid_answers is not None else (f" {'-':>7}" if texts else "")
            lines.append(f"  {m.player_id:<22} {'':<9} {'':<17} {mu} {sigma} {cons} {m.games:>7} {m.score:6.3f}"
                         f"{' ' * (sum(w + 1 for w in widths) + 18)}{invalid}")
    lines.append(f"(score: mean outcome over all its games, win 1, draw .5"
                 + (", 'vs <anchor>': its score against that anchor over their recent games"
                    if report.anchors else "")
                 + f"; return, length: means over each player's last {RECENT_GAMES} games"
                 + ("; invalid: a text agent's answers that did not count there, per turn (each retry and each move "
                    "the game refused counts: 0 when every first answer counted)" if texts else "")
                 + ("; per game: TrueSkill from that game's rating matches, its games, score and invalid answers per turn"
                    if report.games else "")
                 + ")")
    return "\n".join(lines)
