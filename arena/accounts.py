"""Who may write to an arena service: accounts as API tokens, the names they own, withdrawals.

`ludus arena token add NAME` makes an account and prints its token once; the arena keeps only the
token's SHA-256 (ledger meta ``arena_accounts``), so a copy of the arena directory does not give
anyone the right to upload. Every write to the service (`arena/service.py`) carries the token as
``Authorization: Bearer <token>``.

Operator and accounts share one namespace of entrant names, compared ignoring case
(`ludus.arena.store.name_key`). A name belongs to whoever made its first successful entry: the
operator (`ludus arena submit`, bots) or the account of the first upload under it. The claim is
the entry itself: each entrant's ledger row records who entered it and its normalised name, so
the INSERT that enters it is the claim, and an upload that is refused or fails claims nothing.
Each upload of an account's name is a new version, entered as ``NAME@1``, ``NAME@2``, ... in
the spelling of its first entry (all keep playing until withdrawn); an operator's name can be
neither re-versioned nor withdrawn by an account.

Entrants recorded before rows carried their owner are read as before: an entrant named
``NAME@k`` whose name the old claims (``arena_names``, case-sensitive) give to an account is
that account's; every other one (bots, names without a version) is the operator's. A claim in
``arena_names`` that no entry backs (a refused upload used to claim its name) is ignored.

Withdrawn entrants (``arena_withdrawn``: player id -> time) keep their matches and ratings
history but are never scheduled again and leave the leaderboard. Dead entrants (``arena_dead``:
player id -> when and why), which the service's scheduler gave up on after their fault budget
ran out, stay on the leaderboard but are never scheduled again; a new version of the name is a
new entrant and plays.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Mapping

from ludus.arena.store import ArenaError, Entrant, base_name, name_key, read_entrants
from ludus.league.records.ledger import Store

ACCOUNTS_KEY = "arena_accounts"
NAMES_KEY = "arena_names"
"""Legacy (read only): name -> account, as uploads claimed names before entries recorded their owner."""
WITHDRAWN_KEY = "arena_withdrawn"
DEAD_KEY = "arena_dead"
OPERATOR = "operator"
ACCOUNT = "account"
"""`Entrant.entered_by` values."""
TOKEN_PREFIX = "ludus_"
_ACCOUNT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")  # fullmatch: `$` would let a trailing newline in


class NameTakenError(ArenaError):
    """The entrant name (ignoring case) belongs to someone else."""


class NotYoursError(ArenaError):
    """An account asked to change an entrant it did not enter."""


@dataclass(frozen=True)
class Account:
    name: str
    created_at: float


@dataclass(frozen=True)
class NameClaim:
    """Who an entrant name belongs to: whoever made its first successful entry."""

    key: str
    """The normalised name (`ludus.arena.store.name_key`)."""
    name: str
    """The name as its first entry spelled it (later versions use this spelling)."""
    account: str | None
    """The account that owns it; None: the operator."""

    @property
    def owner(self) -> str:
        return "the operator" if self.account is None else f"account {self.account!r}"


@dataclass(frozen=True)
class Death:
    """Why the scheduler gave up on an entrant, and when."""

    at: float
    why: str


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def add_account(store: Store, name: str) -> str:
    """Create account `name` (store opened for writing); returns its new token (shown once)."""
    if not _ACCOUNT_RE.fullmatch(name):
        raise ArenaError(f"account name {name!r} must be 1-40 letters, digits, '_' or '-', starting with a letter "
                         f"or digit")
    accounts = dict(store.get_meta(ACCOUNTS_KEY, {}))
    if name in accounts:
        raise ArenaError(f"account {name!r} exists; `ludus arena token revoke {name}` first to give it a new token")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    accounts[name] = {"sha256": _digest(token), "created_at": time.time()}
    store.set_meta(ACCOUNTS_KEY, accounts)
    return token


def revoke_account(store: Store, name: str) -> None:
    """Remove an account's token (its entrants stay; their names stay its own)."""
    accounts = dict(store.get_meta(ACCOUNTS_KEY, {}))
    if accounts.pop(name, None) is None:
        raise ArenaError(f"no account {name!r} in this arena; `ludus arena token list` shows them")
    store.set_meta(ACCOUNTS_KEY, accounts)


def accounts(store: Store) -> list[Account]:
    return [Account(name, float(entry["created_at"])) for name, entry in store.get_meta(ACCOUNTS_KEY, {}).items()]


def authenticate(accounts_meta: Mapping[str, Mapping], token: str | None) -> Account | None:
    """The account a token belongs to, or None (compared in constant time against every account)."""
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = _digest(token)
    found = None
    for name, entry in accounts_meta.items():
        if hmac.compare_digest(digest, str(entry["sha256"])):
            found = Account(name, float(entry["created_at"]))
    return found


def entrant_account(entrant: Entrant, legacy_names: Mapping[str, str]) -> str | None:
    """The account that entered `entrant`, or None for the operator (`legacy_names`: ``arena_names``)."""
    if entrant.entered_by is not None:
        return entrant.account if entrant.entered_by == ACCOUNT else None
    # An old row: the service numbered every upload NAME@k and never entered a bot, so only such a
    # row can be an account's; an operator's `random-python` stays the operator's even where an
    # account later claimed the name `random-python` (the takeover old stores allowed).
    if entrant.kind == "bot" or "@" not in entrant.player_id:
        return None
    return legacy_names.get(base_name(entrant.player_id))


def entrant_owners(store: Store) -> dict[str, str | None]:
    """Player id -> the account that entered it (None: the operator), for every entrant."""
    legacy = store.get_meta(NAMES_KEY, {})
    return {e.player_id: entrant_account(e, legacy) for e in read_entrants(store)}


def name_claims(store: Store) -> dict[str, NameClaim]:
    """Normalised name -> its claim: the owner of its first entry, in submission order."""
    legacy = store.get_meta(NAMES_KEY, {})
    claims: dict[str, NameClaim] = {}
    for entrant in read_entrants(store):
        key = name_key(entrant.player_id)
        if key not in claims:
            claims[key] = NameClaim(key, base_name(entrant.player_id), entrant_account(entrant, legacy))
    return claims


def check_name_free(store: Store, name: str, account: str | None) -> NameClaim | None:
    """The claim on `name` if `account` (None: the operator) may enter under it (None: nobody has
    it yet); `NameTakenError` if it belongs, ignoring case, to someone else."""
    claim = name_claims(store).get(name_key(name))
    if claim is not None and claim.account != account:
        same = "" if claim.name == base_name(name) else f" as {claim.name!r} (names are compared ignoring case)"
        raise NameTakenError(f"the entrant name {base_name(name)!r} belongs to {claim.owner}{same}; "
                             f"choose another name")
    return claim


def next_version(store: Store, name: str) -> str:
    """The player id of the next version of `name`: ``NAME@k``, k one past the highest version of
    any entrant of the same normalised name (whatever its spelling)."""
    key = name_key(name)
    highest = 0
    for entrant in read_entrants(store):
        base, _, version = entrant.player_id.partition("@")
        if base.casefold() == key and version.isdigit():
            highest = max(highest, int(version))
    return f"{name}@{highest + 1}"


def withdrawn(store: Store) -> dict[str, float]:
    """Player id -> when it was withdrawn."""
    return dict(store.get_meta(WITHDRAWN_KEY, {}))


def active_entrants(store: Store) -> list[Entrant]:
    """The entrants that play: all but the withdrawn, in submission order."""
    gone = withdrawn(store)
    return [e for e in read_entrants(store) if e.player_id not in gone]


def withdraw(store: Store, player_id: str, account: str | None = None) -> None:
    """Take an entrant out of scheduling and the leaderboard (its history stays in the ledger).

    `account`: the account asking (None: the operator, who may withdraw any entrant); an account
    may withdraw only the entrants it entered (`NotYoursError`)."""
    if store.player(player_id) is None:
        raise ArenaError(f"no entrant {player_id!r} in this arena; `ludus arena list` shows them")
    if account is not None:
        owner = entrant_owners(store).get(player_id)
        if owner != account:
            by = "the operator" if owner is None else f"account {owner!r}"
            raise NotYoursError(f"{player_id!r} is not an entrant of account {account!r} (entered by {by})")
    gone = withdrawn(store)
    if player_id not in gone:
        gone[player_id] = time.time()
        store.set_meta(WITHDRAWN_KEY, gone)


def dead(store: Store) -> dict[str, Death]:
    """Player id -> why and when the scheduler gave up on it."""
    return {pid: Death(float(d["at"]), str(d["why"])) for pid, d in store.get_meta(DEAD_KEY, {}).items()}


def mark_dead(store: Store, deaths: Mapping[str, str]) -> None:
    """Record entrants the scheduler gave up on (player id -> why), so no later round or restarted
    service schedules them again (their forfeits would only feed each other's ratings)."""
    known = dict(store.get_meta(DEAD_KEY, {}))
    new = {pid: {"at": time.time(), "why": why} for pid, why in deaths.items() if pid not in known}
    if new:
        store.set_meta(DEAD_KEY, {**known, **new})


def scheduled_entrants(store: Store) -> list[Entrant]:
    """The entrants the service's scheduler pairs: the active ones less the dead."""
    gone = dead(store)
    return [e for e in active_entrants(store) if e.player_id not in gone]
