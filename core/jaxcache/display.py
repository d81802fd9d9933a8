"""Object names as a terminal, a table or a log line may show them: nothing in a name can hide, reorder or fake text.

A cache root's names come from whoever could write there. A bidirectional override (``jit_\\u202eevil\\u202d`` shows
as ``jit_live``), a terminal escape, a newline or an invisible character would make a name display as another, or
rewrite the lines around it. The CLI's tables and messages, and the service's pages, show names through
:func:`shown`.
"""

from __future__ import annotations


def _escape(ch: str) -> str:
    if ch == "\\":
        return "\\\\"
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: str) -> str:
    """``text`` with every character that is not printable (controls, bidirectional and other format characters,
    line and paragraph separators, spaces other than ' ', surrogates, unassigned code points) written as a visible
    escape (``\\u202e``, ``\\x1b``), and a backslash doubled so that an escape cannot be faked. Printable text,
    other scripts included, is left as it is."""
    if text.isprintable() and "\\" not in text:  # nearly every name: one C-level test
        return text
    return "".join(ch if ch.isprintable() and ch != "\\" else _escape(ch) for ch in text)


#: How much of a value from input (a file's line, a flag) a message quotes.
EXCERPT_CHARS = 80


def excerpt(text: str, most: int = EXCERPT_CHARS) -> str:
    """``text`` as a message quotes input: :func:`shown`, in quotes, cut after ``most`` characters (saying how many
    more there were), so that a 600 MB line or a 5,000-digit number never floods the terminal or a log."""
    if len(text) <= most:
        return repr(shown(text))
    return f"{shown(text[:most])!r}... ({len(text) - most} more characters)"
