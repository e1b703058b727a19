"""Griffe extension for the docs build: render the reST bits of hf_metasd's docstrings as Markdown.

The library's docstrings are Google style, but their maths is written the reST way (``:math:`x```, ``.. math:: x``)
and a few end a sentence with ``::`` before an indented literal block. Markdown knows none of that, so before
mkdocstrings parses a docstring this extension rewrites, in the text it renders only (the library is untouched):

* ``:math:`x``` -> ``$x$`` (inline maths for ``pymdownx.arithmatex``),
* ``.. math:: x`` (one line, or a directive followed by an indented block) -> a ``$$ ... $$`` block,
* ``text::`` + indented block -> ``text:`` + the same block (Markdown renders it as code, as reST does),
* an ``Example:`` section -> ``Examples:`` (griffe reads only the plural as doctest examples; the singular would be an
  admonition whose ``>>>`` lines Markdown mangles).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_INLINE = re.compile(r":math:`([^`]+)`")
_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\. math::\s*(?P<body>.*)$")
_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def rst_to_markdown(text: str) -> str:
    """Rewrite reST maths and ``::`` literal-block markers of one docstring into Markdown."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i])
        if match is None:
            line = lines[i]
            if line.rstrip().endswith("::") and line.strip() != "::":
                line = line.rstrip()[:-1]
            out.append(line)
            i += 1
            continue
        indent, body = match.group("indent"), match.group("body").strip()
        maths = [body] if body else []
        i += 1
        # the directive's content: following lines indented deeper than the directive (blank lines inside allowed)
        while i < len(lines) and (not lines[i].strip() or _indent_of(lines[i]) > len(indent)):
            if not lines[i].strip() and (i + 1 >= len(lines) or _indent_of(lines[i + 1]) <= len(indent)):
                break
            if lines[i].strip():
                maths.append(lines[i].strip())
            i += 1
        if out and out[-1].strip():
            out.append("")
        out.extend([f"{indent}$$", *(f"{indent}{m}" for m in maths), f"{indent}$$"])
        if i < len(lines) and lines[i].strip():
            out.append("")
    text = _INLINE.sub(lambda m: f"${m.group(1).strip()}$", "\n".join(out))
    return _EXAMPLE.sub(r"\1Examples:", text)


class RstMath(griffe.Extension):
    """Apply `rst_to_markdown` to every docstring griffe loads."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
