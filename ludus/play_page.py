"""The play page: a person plays one seat of a game in the browser (`ludus arena serve`'s ``/play``
and `ludus play --web`). One self-contained page — the style sheet `PLAY_PAGE_CSS` and the script
`PLAY_JS` (ludus/web/play.js) inline, verbatim, so a server's Content-Security-Policy allows them
by hash — that talks to its own server's play API (`ludus.agents.human_seat.add_play_routes`)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Sequence

from ludus.pages import PAGE_CSS, csp_hash

PLAY_JS = (Path(__file__).resolve().parent / "web" / "play.js").read_text()

PLAY_PAGE_CSS = PAGE_CSS + """
nav a { margin-right: 14px; }
form label { display: block; margin: 8px 0 2px; } input[type=text], input[type=password] { width: 360px; }
#status { font-size: 16px; font-weight: 600; margin: 12px 0 6px; } #message { color: #b00; min-height: 1.2em; }
#seats { color: #555; font-size: 13px; }
#board { border-collapse: collapse; margin: 10px 0; } #board td { padding: 2px; border: none; }
#board button.cell { width: 52px; height: 52px; font-size: 26px; font-weight: 700; border: 1px solid #bbb;
  background: #fafafa; border-radius: 6px; cursor: pointer; font-family: DejaVu Sans Mono, Menlo, monospace; }
#board button.cell:disabled { cursor: default; color: #222; }
#board button.cell:enabled:hover { background: #e4eefc; border-color: #1f4e8c; }
#board button.cell.mark-x, #board button.cell.mark-x:disabled { color: #1f4e8c; }
#board button.cell.mark-o, #board button.cell.mark-o:disabled { color: #c0392b; }
#view { font-family: DejaVu Sans Mono, Menlo, monospace; font-size: 14px; background: #fafafa; border: 1px solid #ddd;
  padding: 10px 14px; white-space: pre-wrap; max-height: 32em; overflow-y: auto; }
#legal button { margin: 3px; font-family: DejaVu Sans Mono, Menlo, monospace; }
#text-move input { width: 420px; } #result { margin-top: 12px; font-weight: 600; }
"""


def play_security_headers() -> list[tuple[str, str]]:
    """The headers of `ludus play --web`'s responses: only this page's own script and style run."""
    policy = (f"default-src 'none'; script-src {csp_hash(PLAY_JS)}; style-src {csp_hash(PLAY_PAGE_CSS)}; "
              "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
    return [("content-security-policy", policy), ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"), ("x-frame-options", "DENY")]


def _embedded_json(value: object) -> str:
    """JSON safe inside a <script> element: no '</' can close it early."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def play_page(game: str, num_seats: int, opponents: Sequence[str], token: bool, default_seat: int = 0,
              title: str = "Play", nav: str = "", intro: str = "", replays: bool = False) -> str:
    """The page. `opponents`: the entrants a person may choose (one, fixed, at `ludus play --web`);
    `token`: the server wants an account's API token (the arena service); `replays`: the server
    has match pages and a leaderboard to link a finished game to."""
    e = html.escape
    choose = len(opponents) > 1 or token
    if opponents:
        options = "".join(f'<option value="{e(o)}">{e(o)}</option>' for o in opponents)
        opponent = (f'<label>Opponent (an entrant)</label><select name="opponent">{options}</select>' if choose
                    else f'<p>Opponent: <b id="opponent">{e(opponents[0])}</b></p>')
    else:
        opponent = '<p class="empty" id="no-opponents">No entrant can be played yet.</p>'
    seats = "".join(f'<option value="{k}"{" selected" if k == default_seat else ""}>{k}'
                    f'{" (moves first)" if k == 0 else ""}</option>' for k in range(num_seats))
    token_field = ('<label>Your API token (the arena operator makes it: <code>ludus arena token add NAME</code>); '
                   'you play as <code>human:NAME</code></label>'
                   '<input type="password" name="token" autocomplete="off" required>' if token else "")
    config = {"game": game, "token": token, "choose_opponent": choose, "replays": replays}
    body = (f'<p class="meta">game <b>{e(game)}</b></p>{intro}'
            f'<form id="start">{token_field}{opponent}<label>Your seat</label><select name="seat">{seats}</select>'
            '<p><button type="submit">start a game</button></p></form><div id="message"></div>'
            '<section id="game" hidden><p id="seats"></p><p id="status"></p><table id="board"></table>'
            '<pre id="view" hidden></pre><div id="legal"></div>'
            '<form id="text-move" hidden><label>Your move (as the game asks for it)</label>'
            '<input type="text" name="move" autocomplete="off" maxlength="2000"> <button type="submit">send</button>'
            '</form><p id="result" hidden></p></section>'
            f'<script type="application/json" id="play-config">{_embedded_json(config)}</script>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(title)}</title><style>{PLAY_PAGE_CSS}</style></head><body>{nav}"
            f"<h1>{e(title)}</h1>{body}<script>{PLAY_JS}</script></body></html>\n")
