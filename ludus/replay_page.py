"""The replay player: an episode (`ludus.league.records.replay.match_episode`) as a page section that animates
it move by move — play/pause, step back and forward, first/last, a scrub bar, the list of moves
(click to jump), arrow keys — with one small self-contained script (`ludus/web/replay_player.js`,
inlined: no CDN, no network). Board games show their board (drawn as SVG where the board text is
a grid of cells); dialogue games their private contexts and the transcript, as the game renders
them. Used by the arena service's match pages,
`ludus arena leaderboard --html` and `ludus replay RUN MATCH --html`.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from ludus.pages import PAGE_CSS

PLAYER_JS = (Path(__file__).resolve().parent / "web" / "replay_player.js").read_text()

PLAYER_CSS = """
.ludus-replay { margin: 12px 0; }
.ludus-replay .board { font-family: DejaVu Sans Mono, Menlo, monospace; font-size: 15px; background: #fafafa;
  border: 1px solid #ddd; padding: 10px 14px; min-height: 4em; white-space: pre; overflow-x: auto; }
.ludus-replay .controls { display: flex; gap: 6px; align-items: center; margin: 8px 0; flex-wrap: wrap; }
.ludus-replay .scrub { flex: 1; min-width: 160px; }
.ludus-replay .step-label { color: #444; font-size: 13px; }
.ludus-replay .moves { font-size: 12px; color: #555; max-height: 14em; overflow-y: auto; padding-left: 1.5em; }
.ludus-replay .moves li { cursor: pointer; } .ludus-replay .moves li.current { font-weight: bold; color: #000; }
.ludus-replay .board-drawing { margin: 6px 0; } .ludus-replay [hidden] { display: none; }
"""


REPLAY_PAGE_CSS = PAGE_CSS + PLAYER_CSS
"""The one inline style sheet of `replay_html` (a server's CSP allows it by hash: `ludus.pages.csp_hash`)."""


def _embedded_json(value: object) -> str:
    """JSON safe inside a <script> element: no '</' can close it early."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def player_section(episode: dict, element_id: str = "replay") -> str:
    """The player's HTML for one episode (needs `PLAYER_CSS` in the page and `PLAYER_JS` after it)."""
    seats = "".join(
        f"<tr><td>{seat}</td><td class=\"name\">{html.escape(str(player))}</td><td>{team}</td>"
        f"<td>{ret:g}</td><td class=\"name\">{html.escape(status)}{': ' + html.escape(error) if error else ''}</td></tr>"
        for seat, (player, team, ret, status, error) in enumerate(zip(
            episode["players"], episode["teams"], episode["returns"], episode["statuses"], episode["errors"])))
    return (f'<div class="ludus-replay" id="{html.escape(element_id)}" tabindex="0" data-step="0">'
            f'<table class="seats"><tr><th>seat</th><th class="name">player</th><th>team</th><th>return</th>'
            f'<th class="name">status</th></tr>{seats}</table>'
            '<div class="controls"><button class="first" title="first">|&lt;</button>'
            '<button class="back" title="step back">&lt;</button><button class="play">play</button>'
            '<button class="forward" title="step forward">&gt;</button><button class="last" title="last">&gt;|</button>'
            '<input class="scrub" type="range" min="0" value="0" step="1" aria-label="step"></div>'
            '<div class="step-label"></div><pre class="board"></pre><ol class="moves" start="0"></ol>'
            f'<script type="application/json">{_embedded_json(episode)}</script></div>')


def replay_html(episode: dict, title: str, intro: str = "") -> str:
    """A whole self-contained page with the player of one episode. Its only inline code is
    `PLAYER_JS` and `REPLAY_PAGE_CSS`, verbatim, so a server can allow them by hash; the episode
    is a JSON data block, which a Content-Security-Policy does not treat as script."""
    verdict = "forfeit" if episode.get("forfeit") else "played to the end"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{REPLAY_PAGE_CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{intro}"
            f'<p class="meta">{html.escape(episode["game"])}, seed {episode["seed"]}, {len(episode["steps"]) - 1} '
            f"steps, {verdict}</p>{player_section(episode)}<script>{PLAYER_JS}</script></body></html>\n")
