"""Text from strangers made safe to print, or to use as a file name.

An agent's stderr, its fault messages and its manifest's strings reach terminals and text files.
Terminal escape sequences in them could rewrite what an operator sees (move the cursor, clear the
screen, retitle the window, forge earlier lines), so every text output escapes control characters.
Some characters that are not controls still change what a reader sees: bidirectional overrides
(U+202E shows "exe.txt" as "txt.exe") and the Unicode line and paragraph separators (U+2028,
U+2029, line breaks in editors and browsers); they are escaped too.

`printable` keeps newlines and tabs (stderr logs, replays: text of many lines); `one_line` escapes
them as well, for a value that must stay one line: a table cell, a field of a listing, a name.
"""

from __future__ import annotations

import re
import unicodedata

# Characters that reorder or break a displayed line without being C0/C1 controls: the bidi marks,
# embeddings, overrides and isolates (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069) and the
# line and paragraph separators (U+2028, U+2029).
# Lone surrogates (U+D800-U+DFFF, from JSON's "\ud800") are escaped as well: printing one raises
# UnicodeEncodeError instead of showing anything.
_LAYOUT = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
# C0 controls except tab and newline, DEL, the C1 range (U+0080-U+009F: 8-bit CSI and friends)
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_LAYOUT}]")
# the same with tab and newline: what may not appear inside one line
_CONTROL_ONE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_LAYOUT}]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    r"""`text` with every control character but tab and newline written as a visible escape
    (ESC becomes ``\x1b``, U+202E ``\u202e``), so printing it cannot drive the terminal."""
    return _CONTROL.sub(_escape, text)


def one_line(text: str) -> str:
    r"""`text` escaped like `printable`, newline, carriage return and tab included (``\x0a``):
    it prints as one line, so a stranger's value cannot forge rows of a table it is a cell of."""
    return _CONTROL_ONE_LINE.sub(_escape, text)


def unsafe_character(text: str) -> str | None:
    """The first character `one_line` would escape, described as ``U+202E RIGHT-TO-LEFT OVERRIDE``
    (None when there is none): what a field that must be one line of plain text refuses."""
    found = _CONTROL_ONE_LINE.search(text)
    if found is None:
        return None
    char = found.group()
    name = unicodedata.name(char, "") or ("(a lone surrogate)" if unicodedata.category(char) == "Cs"
                                          else "(a control character)")
    return f"U+{ord(char):04X} {name}"


def safe_file_name(text: str, limit: int = 100) -> str:
    """`text` as one path component: letters, digits, '-', '_' and '.' kept, anything else '_'."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:limit]
