"""Writing a benchmark's markdown table into a document, between two marker comments."""

from __future__ import annotations

import re

__all__ = ["replace_block", "emit_table"]


def replace_block(path, start: str, end: str, text: str) -> None:
    """Put ``text`` between the lines ``start`` and ``end`` of the file at ``path`` (appended with
    the markers if the file has none yet)."""
    with open(path) as f:
        doc = f.read()
    block = f"{start}\n{text}\n{end}"
    if start in doc and end in doc:
        doc = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


def emit_table(text: str, path, start: str, end: str) -> None:
    """Print a benchmark's table; with ``path``, also put it between the markers of that file."""
    print(text)
    if path:
        replace_block(path, start, end, text)
