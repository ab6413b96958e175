"""File bodies as fenced code blocks in the assistant's message, instead of JSON-escaped strings.

`write_file(path)` without `content` writes the last fenced block of the same assistant
message (its text before the tool call): a small model writes a 4,000-token env.py far more
reliably as a plain ```python block than as one JSON string with every quote and newline
escaped.

The rules (a subset of CommonMark's fenced code blocks, kept strict so the text is verbatim):

- A fence is a line of three or more backticks starting at column 0. The opening fence may
  carry an info string (```python); it is ignored. The closing fence is a line of at least
  as many backticks as the opening one and nothing else (trailing whitespace allowed), so a
  file that itself holds ``` lines can be wrapped in a longer fence (````).
- The block's text is every line between the two fences, each with its own newline: a block
  whose last line is followed by the closing fence ends with "\n"; an empty block is "".
  Nothing else is added, removed or re-indented. (A file must therefore end with a newline;
  one that must not is written with `content`.)
- A fence left open runs to the end of the text (CommonMark's rule: the tool call that
  follows the block shows the model meant it to end there).
- With several blocks, the last one is taken.
"""

from __future__ import annotations

import re

FENCE = re.compile(r"(`{3,})([^`]*)")
LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")


def last_fenced_block(text: str) -> str | None:
    """The text of the last fenced code block in `text`, verbatim, or None when there is none."""
    last: str | None = None
    open_len = 0  # backticks of the open fence; 0 when outside a block
    body: list[str] = []
    for line in LINE.findall(text):  # each line with its own newline (the last may have none)
        stripped = line.rstrip()
        if not open_len:
            match = FENCE.fullmatch(stripped)
            if match:
                open_len, body = len(match.group(1)), []
        elif len(stripped) >= open_len and stripped == "`" * len(stripped):
            last, open_len = "".join(body), 0
        else:
            body.append(line)
    if open_len:  # left open: the block runs to the end of the text
        last = "".join(body)
    return last


def fenced(text: str, info: str = "") -> str:
    """`text` as a fenced block that `last_fenced_block` reads back exactly (a newline is added if
    `text` lacks a final one), with a fence longer than any run of backticks inside it."""
    if text and not text.endswith("\n"):
        text += "\n"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}{fence}"
