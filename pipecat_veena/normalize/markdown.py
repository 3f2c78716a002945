"""Markdown an LLM writes into a reply, removed before the rules read the text.

``**48**`` would otherwise look like a masked card number (``**** 1234``), a heading's ``#`` like
"number", a bullet's ``-`` like a minus. Emphasis (``**x**``, ``*x*``, ``__x__``, ``_x_``,
``~~x~~``) and inline code keep their text; heading marks, bullets and code fences go. A mark
must enclose text the way markdown does (no space just inside it, no word or mark just outside),
so masks (``XXXX1234``, ``****1234``, ``**** 1234``), products (``2 * 3``) and snake_case names
stay as they are.
"""

from __future__ import annotations

import re


def _enclosed(mark: str) -> str:
    """``mark`` text ``mark`` on one line: no space inside the marks, no mark inside the text."""
    m = re.escape(mark)
    c = re.escape(mark[0])
    return rf"(?<![\w{c}]){m}([^\s{c}](?:[^{c}\n]*[^\s{c}])?){m}(?![\w{c}])"


#: Outer marks first, so that nested ones (**bold _and italic_**) all go in one call.
_EMPHASIS = tuple(re.compile(_enclosed(mark)) for mark in ("***", "**", "__", "~~", "*", "_"))
_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
#: At a line start: a code fence, heading marks or a bullet (not "-5", "**" or "+91").
_LINE_MARKS = re.compile(r"(?m)^[ \t]*(?:```[^\n]*$|#{1,6}[ \t]+|[-*+•][ \t]+)")
#: Anything markdown could start with; text without any of these is left alone at no cost.
_ANY = re.compile(r"[*_~`#•]|^[ \t]*[-+]", re.M)


def strip_markdown(text: str) -> str:
    """``text`` without markdown marks; text with none comes back as it is.

    Args:
        text: what an LLM wrote (Hindi, English, code-mixed).

    Returns:
        The same text with emphasis, inline code, headings, bullets and code fences unmarked.
    """
    if not _ANY.search(text):
        return text
    text = _LINE_MARKS.sub("", text)
    for pattern in (_CODE, *_EMPHASIS):
        text = pattern.sub(r"\1", text)
    return text
