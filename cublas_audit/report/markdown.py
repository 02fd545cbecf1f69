"""Markdown text: the escaping every string that reaches a report goes through, and tables.

Every cell, heading and line that holds user or kernel text (labels, GPU and routine names, kernel
names, paths, env.json fields) goes through `md_text` (prose and cells) or `md_code` (code spans);
tables are made by `md_table` alone.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

import jinja2
from tabulate import tabulate

from cublas_audit.table.dispatch import plain

SHORT_NAME_MAX = 40

# Markdown's punctuation that can start emphasis, code, links, HTML, tables, headings or
# strikethrough; a backslash escapes each on GitHub.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#&~])")
# Characters that never reach a report as themselves: C0 and C1 controls (a newline would split a
# table row or start a heading), zero-width and line/paragraph separators, and the bidirectional
# embeddings, overrides and isolates that make text display in another order than it reads.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(value: object, keep_newlines: bool = False) -> str:
    """Text with every invisible or reordering character written out as its escape (`\\n`,
    `\\u202e`): what a reader sees is what the input holds, on one line unless kept."""

    def written(match: re.Match[str]) -> str:
        char = match.group(0)
        if keep_newlines and char == "\n":
            return char
        return _NAMED.get(char, f"\\u{ord(char):04x}")

    return _INVISIBLE.sub(written, str(value))


def md_text(value: object) -> str:
    """Any text as inert GitHub Markdown on one line: invisible characters written out, then
    emphasis, code, link, HTML, entity, table and heading characters escaped; `::` escaped too so
    `cutlass::gemm::` never reads as an emoji shortcode."""
    text = visible(value)
    if not _MD_SPECIAL.search(text) and "::" not in text:
        return text  # most cells are plain numbers and names: skip the substitution
    return _MD_SPECIAL.sub(r"\\\1", text).replace("::", r"\:\:")


def md_code(value: object, in_table: bool = True) -> str:
    """A code span no content can close: its fence is one backtick longer than the longest run
    inside; inside a table a `|` is still escaped (GitHub splits cells before code spans)."""
    text = visible(value)
    fence = "`" * (_longest_backtick_run(text) + 1)
    if in_table:
        text = text.replace("|", r"\|")
    pad = " " if text.startswith("`") or text.endswith("`") or fence != "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_fence(text: object, language: str = "") -> str:
    """A fenced code block no content can close (the fence outgrows every backtick run in it);
    lines are kept, every other invisible character is written out."""
    body = visible(text, keep_newlines=True).strip("\n")
    fence = "`" * max(3, _longest_backtick_run(body) + 1)
    return f"{fence}{language}\n{body}\n{fence}"


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def shorten(name: str, limit: int = SHORT_NAME_MAX) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def md_number(value: object, digits: int) -> str:
    """A number with `digits` decimals, or an em dash for a missing one."""
    value = plain(value)
    return "—" if value is None else f"{float(value):.{digits}f}"  # type: ignore[arg-type]


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    return tabulate(list(rows), headers=list(headers), tablefmt="github", disable_numparse=True)


def cut_line(cut: int, what: str, where: str) -> str:
    """The line under a table or list cut to LISTED_MAX (judge.thresholds): how many `what` were
    cut, and `where` every one of them is; empty where nothing was cut."""
    return f"... and {cut:,} more {what} ({where})." if cut > 0 else ""


def template(name: str) -> jinja2.Template:
    return _environment().get_template(name)


@functools.cache
def _environment() -> jinja2.Environment:
    """The templates' environment, made once: it keeps each template compiled (a fix of the two
    random maps compiled the C template once per pin, 23 times, 0.5 s)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cublas_audit.report", "templates"),
        autoescape=False,  # Markdown, escaped cell by cell with md_text / md_code
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["md"] = md_text
    env.filters["code"] = lambda v: md_code(v, in_table=False)
    env.filters["fence"] = md_fence
    env.filters["one_line"] = visible
    return env
