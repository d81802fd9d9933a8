"""How pages show names others chose: nothing hides or reorders text, and a name mixing scripts (``trаin`` with a
Cyrillic ``а``) is marked, by Unicode TS #39 section 5.1 over fontTools' Script_Extensions data."""

from __future__ import annotations

import functools

from fontTools import unicodedata as ucd
from markupsafe import Markup, escape

from jaxcache.display import shown

#: Common, Inherited, Unknown: they go with any script (TS #39 treats the first two as the set of all scripts).
_ANY = frozenset({"Zyyy", "Zinh", "Zzzz"})
#: TS #39's augmentation: Han, Hiragana, Katakana, Hangul and Bopomofo mix in the writing systems that combine them.
_AUGMENTED = {"Hani": {"Hanb", "Jpan", "Kore"}, "Hira": {"Jpan"}, "Kana": {"Jpan"}, "Hang": {"Kore"},
              "Bopo": {"Hanb"}}


@functools.lru_cache(maxsize=4096)
def _scripts(ch: str) -> frozenset[str] | None:
    """The augmented script set of ``ch``; None for a character of every script."""
    found = set(ucd.script_extension(ch))
    if found & _ANY:
        return None
    for script in list(found):
        found |= _AUGMENTED.get(script, set())
    return frozenset(found)


def scripts_of(text: str) -> list[str]:
    """The scripts of ``text``'s letters (their Script property, Common and Inherited left out), by name, sorted."""
    return sorted({ucd.script_name(s) for s in map(ucd.script, text) if s not in _ANY})


def mixes_scripts(text: str) -> bool:
    """True when no one script covers every character of ``text`` (TS #39's resolved script set is empty)."""
    resolved: frozenset[str] | None = None
    for ch in text:
        found = _scripts(ch)
        if found is None:
            continue
        resolved = found if resolved is None else resolved & found
        if not resolved:
            return True
    return False


def visible(text: object) -> Markup:
    """``text`` for HTML with unprintable characters escaped; Markup, so ``finalize`` does not escape it twice."""
    return escape(shown(str(text)))


def mixed_badge(text: object) -> Markup:
    """A badge saying which scripts a name mixes, with a title that says why it matters; empty for other names."""
    if not (isinstance(text, str) and mixes_scripts(text)):
        return Markup("")
    return Markup(' <span class="badge mixed-scripts" data-mixed-scripts title="This name mixes scripts ({}): some'
                  ' of its letters may look like letters of another script">mixed scripts</span>'
                  ).format(", ".join(scripts_of(text)))


def name(text: object) -> Markup:
    """A name in a page's text: :func:`visible`, and :func:`mixed_badge`."""
    return visible(text) + mixed_badge(text)


def name_text(text: object) -> Markup:
    """A name where markup cannot go (a page title): :func:`visible`, and "(mixed scripts)" when it mixes them."""
    out = visible(text)
    return out + " (mixed scripts)" if isinstance(text, str) and mixes_scripts(text) else out


def raw(text: object) -> Markup:
    """A value that must come back as it went out (a form field's value): escaped for HTML only."""
    return escape(str(text))


def finalize(value: object) -> object:
    """Every template's ``{{ }}``: a plain string is escaped with ``shown``; a filter's Markup is left as it is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value)
    return value
