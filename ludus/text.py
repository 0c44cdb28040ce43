"""Text from strangers made safe to print, or to use as a file name.

An agent's stderr, its fault messages and its manifest's strings reach terminals and text files.
Terminal escape sequences in them could rewrite what an operator sees (move the cursor, clear the
screen, retitle the window, forge earlier lines), so every text output escapes control characters.
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, and the C1 range (U+0080-U+009F: 8-bit CSI and friends)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    r"""`text` with every control character but tab and newline written as a visible escape
    (ESC becomes ``\x1b``), so printing it cannot drive the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def safe_file_name(text: str, limit: int = 100) -> str:
    """`text` as one path component: letters, digits, '-', '_' and '.' kept, anything else '_'."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:limit]
