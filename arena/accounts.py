"""Who may write to an arena service: accounts as API tokens, the names they own, withdrawals.

`ludus arena token add NAME` makes an account and prints its token once; the arena keeps only the
token's SHA-256 (ledger meta ``arena_accounts``), so a copy of the arena directory does not give
anyone the right to upload. Every write to the service (`arena/service.py`) carries the token as
``Authorization: Bearer <token>``.

An entrant name belongs to the account that first uploaded under it (``arena_names``): each
upload of that name is a new version, entered as ``NAME@1``, ``NAME@2``, ... (all keep playing
until withdrawn). Withdrawn entrants (``arena_withdrawn``: player id -> time) keep their matches
and ratings history but are never scheduled again and leave the leaderboard.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Mapping

from arena.store import ArenaError, Entrant, read_entrants
from league.ledger import Store

ACCOUNTS_KEY = "arena_accounts"
NAMES_KEY = "arena_names"
WITHDRAWN_KEY = "arena_withdrawn"
TOKEN_PREFIX = "ludus_"
_ACCOUNT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")


@dataclass(frozen=True)
class Account:
    name: str
    created_at: float


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def add_account(store: Store, name: str) -> str:
    """Create account `name` (store opened for writing); returns its new token (shown once)."""
    if not _ACCOUNT_RE.match(name):
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


def claim_name(store: Store, name: str, account: str) -> None:
    """Make `name` the account's (the first upload under it), or refuse another account's name."""
    names = dict(store.get_meta(NAMES_KEY, {}))
    owner = names.get(name)
    if owner is None:
        names[name] = account
        store.set_meta(NAMES_KEY, names)
    elif owner != account:
        raise ArenaError(f"the entrant name {name!r} belongs to another account; choose another name")


def name_owner(store: Store, name: str) -> str | None:
    return store.get_meta(NAMES_KEY, {}).get(name)


def withdrawn(store: Store) -> dict[str, float]:
    """Player id -> when it was withdrawn."""
    return dict(store.get_meta(WITHDRAWN_KEY, {}))


def active_entrants(store: Store) -> list[Entrant]:
    """The entrants that play: all but the withdrawn, in submission order."""
    gone = withdrawn(store)
    return [e for e in read_entrants(store) if e.player_id not in gone]


def withdraw(store: Store, player_id: str) -> None:
    """Take an entrant out of scheduling and the leaderboard (its history stays in the ledger)."""
    if store.player(player_id) is None:
        raise ArenaError(f"no entrant {player_id!r} in this arena; `ludus arena list` shows them")
    gone = withdrawn(store)
    if player_id not in gone:
        gone[player_id] = time.time()
        store.set_meta(WITHDRAWN_KEY, gone)
