"""What the report and leaderboard pages share: their style sheet (charts: ludus/charts.py)."""

PAGE_CSS = """
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; color: #222; margin: 24px auto; max-width: 1100px;
       padding: 0 16px; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 13px; }
figure { margin: 12px 0; } figcaption { color: #555; font-size: 12px; margin-top: 4px; }
.row { display: flex; flex-wrap: wrap; gap: 24px; }
svg.ludus-chart { max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f6f6f6; } td.name, th.name { text-align: left; }
.empty { color: #777; font-style: italic; }
"""


def csp_hash(text: str) -> str:
    """A Content-Security-Policy source that allows exactly one inline ``<script>`` or ``<style>``
    whose content is `text`: a server sends it instead of 'unsafe-inline', so an injected script
    or style (any other text) is refused by the browser while the pages stay self-contained."""
    import base64
    import hashlib

    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"
