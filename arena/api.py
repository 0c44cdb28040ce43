"""The arena's Python API: everything `ludus arena submit|list|run|leaderboard|replay` does.

    from ludus.arena.api import Arena
    arena = Arena.open("arena_state", game="tic_tac_toe")
    arena.submit("examples/agents/random_python")
    arena.submit("bot:mcts-50")
    report = arena.run_tournament(format="round-robin", games_per_pair=4, seed=1)
    print(format_leaderboard(ludus.arena.leaderboard()))
    print(ludus.arena.replay(report.matches[0].match_id))

`Arena` is a light handle on an arena directory (arena/store.py describes the layout): it holds
no open file between calls. Reads open the ledger read-only; a submission opens it for writing
for a moment; a tournament holds the writer lock while it plays, so a second tournament (or a
submission) on the same arena meanwhile is refused with `StoreLockedError`.

A submission is validated (`ludus.arena.submission.validate_submission`, which imports its code in a
sandbox) before anything is written, so a refused submission leaves the arena byte for byte as
it was; an accepted one is copied into ``submissions/<digest>/``, made read-only, and its
digest is checked again on the copy and before every tournament.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ludus.agents.bots.builtin import BOT_PREFIX
from ludus.arena.accounts import ACCOUNT, OPERATOR, active_entrants, check_name_free, next_version
from ludus.arena.leaderboard import Leaderboard, PageFiles, build_leaderboard, write_page
from ludus.arena.sandbox.isolation import Isolation, SandboxConfig, copy_submission
from ludus.arena.match import MatchLimits
from ludus.arena.sandbox.limits import SandboxLimits
from ludus.arena.store import (
    ARENA_META_KEY,
    SUBMISSIONS_DIRNAME,
    ArenaError,
    ArenaInfo,
    Entrant,
    count_tournaments,
    ledger_exists,
    make_read_only,
    make_writable,
    read_entrants,
    read_info,
    submission_digest_of_copy,
    tournament_key,
    verify_copy,
)
from ludus.arena.submission import Submission, SubmissionKind, validate_submission
from ludus.arena.tournament import TournamentReport, TournamentSettings, play_tournament
from ludus.league.records.ledger import MatchResult, Store
from ludus.league.records.ratings import TrueSkillParams, ensure_params, load_params, rebuild_ratings
from ludus.files import cache_root

DEFAULT_ARENA_DIR = "arena_state"
ARENA_ENV = "LUDUS_ARENA"
"""Environment variable naming the arena directory when none is given."""
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,60}(/[A-Za-z0-9][A-Za-z0-9._-]{0,60})?(@[0-9]{1,6})?")
"""Entrant names: NAME, NAME@k (the service's k-th upload of NAME) or RUN/MEMBER (a league run's
snapshot, ``ludus.arena.submission.source_name``). Always `fullmatch`: ``$`` also matches before a
trailing newline, which let ``honest\n`` through."""


@dataclass(frozen=True)
class ArenaConfig:
    """How an arena runs its agents and tournaments (not stored: pass it to every `Arena.open`)."""

    match_limits: MatchLimits = MatchLimits()
    """Time control of every match: seconds per move and the overage bank per match."""
    sandbox_limits: SandboxLimits = SandboxLimits()
    """Resource limits of each agent process tree (memory, processes, startup time, ...)."""
    isolation: Isolation = Isolation.AUTO
    """Sandbox isolation mode; AUTO picks the strongest this machine offers (`ludus arena doctor`)."""
    require_isolation: bool = True
    """Refuse to run strangers' code without namespaces (mode 'none'); set False only for trusted code."""
    extra_env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for every agent."""
    workspace_root: Path | None = None
    """Where the agents' private directories are made; None: the system temp directory."""
    trueskill: TrueSkillParams = TrueSkillParams()
    """TrueSkill constants of a NEW arena (an existing arena keeps the ones it was created with)."""
    sigma_threshold: float = 2.0
    """Ladder: stop when every entrant's sigma is at most this."""
    max_games: int = 400
    """Ladder: game budget of one tournament."""
    pairs_per_round: int | None = None
    """Ladder: pairings between rating updates; None: half the number of entrants."""
    stderr_bytes: int = 4096
    """The last bytes of each seat's stderr kept in the ledger per match."""


def check_arena_game(game: str) -> None:
    """Refuse a game the arena cannot run (unknown, or not between two sides)."""
    from ludus.arena.tournament import check_two_sides
    from ludus.games import registry

    check_two_sides(registry.spec(game))


def check_entrant_name(name: str | None) -> None:
    """Refuse an entrant name the arena does not take (`_NAME_RE`)."""
    if name is not None and not _NAME_RE.fullmatch(name):
        raise ArenaError(f"name {name!r} must be letters, digits, '.', '_', '-' (starting with a letter or digit), "
                         f"at most one '/' (RUN/MEMBER), optionally with a version '@N'")


def default_arena_dir() -> Path:
    """$LUDUS_ARENA, else ./arena_state."""
    return Path(os.environ.get(ARENA_ENV) or DEFAULT_ARENA_DIR)


class Arena:
    """A handle on an arena directory. Create with `Arena.open`."""

    def __init__(self, directory: Path, game: str | None, config: ArenaConfig):
        """Internal; use `Arena.open`."""
        self.directory = directory
        self.config = config
        self._game = game

    @classmethod
    def open(cls, directory: str | os.PathLike | None = None, game: str | None = None,
             config: ArenaConfig = ArenaConfig()) -> "Arena":
        """The arena in `directory` (default $LUDUS_ARENA or ./arena_state). Creates nothing: a new
        arena comes into being with its first submission, playing `game` (or, without one, the
        game the first submission declares). `game` must match an existing arena's game."""
        directory = Path(directory) if directory is not None else default_arena_dir()
        if directory.exists() and not directory.is_dir():
            raise ArenaError(f"{directory} is a file, not an arena directory; pass another --arena")
        if game is not None:
            check_arena_game(game)
        if ledger_exists(directory):
            arena = cls(directory, None, config)
            info = arena.info()
            if info is None:
                raise ArenaError(f"{directory} holds a Ludus ledger but no arena (a league run directory?); "
                                 f"pass another --arena")
            if game is not None and game != info.game:
                raise ArenaError(f"the arena in {directory} plays {info.game!r}, not {game!r}; use another --arena "
                                 f"for {game!r}")
            return arena
        if directory.is_dir() and set(os.listdir(directory)) - {SUBMISSIONS_DIRNAME}:
            raise ArenaError(f"{directory} is not empty and holds no arena; pass an empty or new --arena directory")
        return cls(directory, game, config)

    # -- reading

    def _reader(self) -> Store:
        if not ledger_exists(self.directory):
            raise ArenaError(f"no arena in {self.directory} yet: submit agents first (`ludus arena submit PATH "
                             f"--game GAME --arena {self.directory}`)")
        return Store.open(self.directory, mode="read")

    def info(self) -> ArenaInfo | None:
        """The arena's game and creation time; None before its first submission."""
        if not ledger_exists(self.directory):
            return None
        with Store.open(self.directory, mode="read") as store:
            return read_info(store)

    @property
    def game(self) -> str | None:
        info = self.info()
        return info.game if info is not None else self._game

    def list(self) -> list[Entrant]:
        """The entrants, in submission order."""
        if not ledger_exists(self.directory):
            return []
        with self._reader() as store:
            return read_entrants(store)

    def same_content(self, entrant: Entrant) -> list[str]:
        """The other entrants whose submission has `entrant`'s digest (the same agent entered twice)."""
        return [e.player_id for e in self.list() if e.digest == entrant.digest and e.player_id != entrant.player_id]

    def leaderboard(self, recent: int = 200) -> Leaderboard:
        """Ratings, records, head-to-head results and the `recent` newest matches."""
        with self._reader() as store:
            return build_leaderboard(store, recent)

    def write_page(self, path: str | os.PathLike, recent: int = 200) -> PageFiles:
        """The static leaderboard page, with replays of the `recent` newest matches beside it."""
        return write_page(self.leaderboard(recent), path)

    def match(self, match_id: int) -> MatchResult:
        from ludus.league.records.replay import check_match_id

        check_match_id(int(match_id))
        with self._reader() as store:
            match = store.get_match(int(match_id))
        if match is None:
            raise ArenaError(f"match {match_id} is not in the arena in {self.directory}; `ludus matches --arena "
                             f"{self.directory}` lists its matches")
        return match

    def replay(self, match_id: int) -> str:
        """The match as text: its seats and statuses, every board, and the result."""
        from ludus.arena.replay import replay_match

        return replay_match(self.match(match_id)).transcript

    # -- submitting

    @property
    def sandbox_config(self) -> SandboxConfig:
        """The sandbox of this arena's agents: its own directory is hidden from them; the host's
        converted base models are shared read-only (a language-model snapshot plays on one of them,
        named by an id the host ships, never on a model of its own)."""
        c = self.config
        models = cache_root() / "models"
        return SandboxConfig(isolation=c.isolation, require_isolation=c.require_isolation,
                             workspace_root=c.workspace_root, hidden_paths=(str(self.directory.resolve()),),
                             extra_env=(("LUDUS_CACHE", str(cache_root())),) + tuple(c.extra_env),
                             shared_paths=(str(models),) if models.is_dir() else ())

    def validate(self, path: str | os.PathLike, game: str | None) -> Submission:
        """Check a submission (a path, or ``bot:NAME``) for `game` in this arena's sandbox; nothing is written."""
        text = os.fspath(path)
        # the check at submit time gets exactly the start-up time the sandbox allows in play
        kwargs = dict(config=self.sandbox_config, limits=self.config.sandbox_limits)
        if text.startswith(BOT_PREFIX):
            bot = text[len(BOT_PREFIX):].strip()
            if game is None:
                raise ArenaError("a new arena needs its game before a bot can enter: pass --game (e.g. "
                                 "--game tic_tac_toe)")
            if os.path.lexists(bot):  # a file of that name must not pass for the bot
                raise ArenaError(f"{text!r}: {bot!r} is also a path here; built-in bots are random, mcts-N, perfect")
            submission = validate_submission(bot, game, **kwargs)
            if submission.kind != SubmissionKind.BUILTIN:
                raise ArenaError(f"{bot!r} is not a built-in bot: use random, mcts-N or perfect")
            return submission
        from ludus.agents.mixture import is_run_directory, newest_run_snapshot

        if is_run_directory(text):  # a league run enters its newest main snapshot (named RUN/main@k)
            text = newest_run_snapshot(text)
        return validate_submission(text, game, **kwargs)

    def submit(self, path: str | os.PathLike, name: str | None = None) -> Entrant:
        """Validate a submission and enter it (a folder, an executable, a snapshot, or ``bot:NAME``).

        Refusals (`SubmissionError`, `ArenaError`) happen before anything is written. Entering
        the same content under the same name again is a no-op that returns the existing entrant.
        """
        check_entrant_name(name)
        return self.enter(self.validate(path, self.game), name)

    def enter(self, submission: Submission, name: str | None = None, account: str | None = None,
              new_version: bool = False) -> Entrant:
        """Enter a `Submission` that `validate_submission` accepted (`submit` does both).

        Copies it into the arena (read-only, checked against its digest) and registers it, owned
        by `account` (None: the operator). Its name must be free or already its owner's, ignoring
        case (`ludus.arena.accounts.NameTakenError`). `new_version`: enter it as the next version
        ``NAME@k`` of `name` (the service's uploads), numbered under the same writer lock."""
        check_entrant_name(name)
        game = self.game
        if game is None:
            game = submission.game
            if game is None:
                raise ArenaError(f"{submission.name!r} plays any game and the arena has none yet: pass --game "
                                 f"(e.g. --game tic_tac_toe)")
            from ludus.games import registry

            if registry.resolves_by_import(game):  # a module path is the operator's to name, never a submitter's
                raise ArenaError(f"{submission.name!r} names the game {game!r}, which only the operator may choose: "
                                 f"pass --game {game}")
            check_arena_game(game)
        elif submission.game not in (None, game):
            raise ArenaError(f"{submission.name!r} plays {submission.game!r}, this arena plays {game!r}")
        player_id = name or submission.name
        for entrant in [] if new_version else self.list():
            if entrant.player_id == player_id:
                if entrant.digest == submission.digest:
                    return entrant
                raise ArenaError(f"an entrant named {player_id!r} is already in the arena (digest "
                                 f"{entrant.digest[:12]}, from {entrant.source}); pass --name to enter this one "
                                 f"under another name")
        copy_path, made = self._store_copy(submission)
        builtin = submission.kind == SubmissionKind.BUILTIN
        try:
            with Store.open(self._create_directory(), mode="write") as store:
                # Checked under the writer lock that the INSERT below holds, and claimed by that
                # INSERT alone (the row records its owner): a refused or failed entry claims nothing
                # and two entries of one name cannot both take it.
                claim = check_name_free(store, player_id, account)
                if new_version:
                    player_id = next_version(store, claim.name if claim is not None else player_id)
                entrant = Entrant(player_id, "bot" if builtin else "submission", submission.kind, submission.version,
                                  submission.digest, copy_path, time.time(), submission.game, submission.entry_point,
                                  submission.executable, submission.bot,
                                  (submission.bot if builtin else str(submission.path)) or "",
                                  OPERATOR if account is None else ACCOUNT, account)
                self._initialise(store, game)
                store.add_player(entrant.to_record())
        except BaseException:
            if made is not None:
                make_writable(made)
                shutil.rmtree(made, ignore_errors=True)
            raise
        return entrant

    def _initialise(self, store: Store, game: str) -> None:
        """Give a new arena its identity (game, creation time) and TrueSkill constants."""
        if read_info(store) is None:
            store.set_meta(ARENA_META_KEY, ArenaInfo(game, time.time()).to_json())
            ensure_params(store, self.config.trueskill)

    def create(self) -> None:
        """Create the arena now (its ledger and game) if it does not exist yet: what accounts and the
        service need before the first submission. A new arena needs its game (`Arena.open(game=...)`)."""
        if ledger_exists(self.directory):
            return
        if self._game is None:
            raise ArenaError(f"{self.directory} holds no arena yet: pass --game (e.g. --game tic_tac_toe) to create it")
        with Store.open(self._create_directory(), mode="write") as store:
            self._initialise(store, self._game)

    def _create_directory(self) -> Path:
        """The arena directory and its submissions folder, private to the arena's user."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.directory / SUBMISSIONS_DIRNAME).mkdir(mode=0o700, exist_ok=True)
        return self.directory

    def _store_copy(self, submission: Submission) -> tuple[str, Path | None]:
        """Copy a validated submission to ``submissions/<digest>`` (read-only) unless it is there.

        Returns the copy's path relative to the arena directory ('' for a bot) and the directory
        made by this call (None when nothing was made)."""
        if submission.kind == SubmissionKind.BUILTIN:
            return "", None
        max_bytes = self.config.sandbox_limits.max_submission_mb << 20
        relative = Path(SUBMISSIONS_DIRNAME) / submission.digest
        if submission.path.is_file():  # a lone executable keeps its file name inside its folder
            relative = relative / submission.path.name
        target = self.directory / SUBMISSIONS_DIRNAME / submission.digest
        if target.exists():
            found = submission_digest_of_copy(submission.kind, self.directory / relative, max_bytes)
            if found != submission.digest:
                raise ArenaError(f"the arena's copy {target} does not match its digest; restore the arena directory")
            return str(relative), None
        incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self._create_directory() / SUBMISSIONS_DIRNAME))
        try:
            copy_submission(submission.path, incoming / "copy", max_bytes)
            copied = incoming / "copy" / submission.path.name if submission.path.is_file() else incoming / "copy"
            found = submission_digest_of_copy(submission.kind, copied, max_bytes)
            if found != submission.digest:
                raise ArenaError(f"{submission.path} changed while it was being submitted; submit it again")
            make_read_only(incoming / "copy")
            os.rename(incoming / "copy", target)
        finally:
            make_writable(incoming)
            shutil.rmtree(incoming, ignore_errors=True)
        return str(relative), target

    # -- playing

    def run_tournament(self, game: str | None = None, format: str = "round-robin", games_per_pair: int = 2,
                       seed: int | None = None, *, max_games: int | None = None,
                       sigma_threshold: float | None = None, workers: int | None = None,
                       progress: Callable[[str], None] | None = None) -> TournamentReport:
        """Play a tournament among all entrants and record it (see arena/tournament.py).

        `seed` defaults to the tournament's number, so successive tournaments use new seeds and
        each one can be replayed. The ladder stops at `sigma_threshold` or after `max_games`
        (defaults from the config). `workers`: matches at once (default one per core)."""
        if not ledger_exists(self.directory):
            raise ArenaError(f"no arena in {self.directory} yet: submit agents first (`ludus arena submit`)")
        c = self.config
        max_bytes = c.sandbox_limits.max_submission_mb << 20
        with Store.open(self.directory, mode="write") as store:
            info = read_info(store)
            if info is None:
                raise ArenaError(f"{self.directory} holds a Ludus ledger but no arena; pass another --arena")
            if game is not None and game != info.game:
                raise ArenaError(f"the arena in {self.directory} plays {info.game!r}, not {game!r}")
            entrants = active_entrants(store)
            for entrant in entrants:
                verify_copy(entrant, self.directory, max_bytes)
            params = load_params(store) or ensure_params(store, c.trueskill)
            table = rebuild_ratings(store, params, kinds=("arena",))
            number = count_tournaments(store) + 1
            settings = TournamentSettings(
                game=info.game, format=format, games_per_pair=games_per_pair,
                seed=number if seed is None else seed, limits=c.match_limits,
                sigma_threshold=c.sigma_threshold if sigma_threshold is None else sigma_threshold,
                max_games=c.max_games if max_games is None else max_games, pairs_per_round=c.pairs_per_round,
                stderr_bytes=c.stderr_bytes, workers=workers)
            entry = {"number": number, "game": info.game, "format": format, "seed": settings.seed,
                     "games_per_pair": games_per_pair, "entrants": [e.player_id for e in entrants],
                     "time_per_move_s": c.match_limits.time_per_move_s, "overage_s": c.match_limits.overage_s,
                     "started_at": time.time(), "finished": False}
            store.set_meta(tournament_key(number), entry)
            report = play_tournament(store, self.directory, entrants, table, settings, number, c.sandbox_limits,
                                     self.sandbox_config, progress)
            ids = [m.match_id for m in report.matches]
            store.set_meta(tournament_key(number), {
                **entry, "finished": True, "duration_s": report.duration_s, "matches": len(ids),
                "first_match_id": min(ids, default=None), "last_match_id": max(ids, default=None),
                "stopped_because": report.stopped_because})
        return report
