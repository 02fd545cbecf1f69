"""Markdown text: the escaping every string that reaches a report goes through, and tables.

Every cell, heading and line that holds user or kernel text (labels, GPU and routine names, kernel
names, paths, env.json fields) goes through `md_text` (prose and cells) or `md_code` (code spans);
tables are made by `md_table` alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import jinja2
from tabulate import tabulate

from cublas_audit.table import plain

SHORT_NAME_MAX = 40

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|])")


def md_text(value: object) -> str:
    """Plain text for GitHub Markdown: emphasis, HTML, link and table characters escaped; `::`
    escaped too so `cutlass::gemm::` never reads as an emoji shortcode."""
    text = str(value)
    if not _MD_SPECIAL.search(text) and "::" not in text:
        return text  # most cells are plain numbers and names: skip the substitution
    return _MD_SPECIAL.sub(r"\\\1", text).replace("::", r"\:\:")


def md_code(value: object, in_table: bool = True) -> str:
    """A code span; inside a table a `|` must still be escaped (GitHub splits cells first)."""
    text = str(value)
    fence = "``" if "`" in text else "`"
    if in_table:
        text = text.replace("|", r"\|")
    return f"{fence}{text}{fence}" if fence == "`" else f"{fence} {text} {fence}"


def shorten(name: str, limit: int = SHORT_NAME_MAX) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def md_number(value: object, digits: int) -> str:
    """A number with `digits` decimals, or an em dash for a missing one."""
    value = plain(value)
    return "—" if value is None else f"{float(value):.{digits}f}"  # type: ignore[arg-type]


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    return tabulate(list(rows), headers=list(headers), tablefmt="github", disable_numparse=True)


def template(name: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cublas_audit", "templates"),
        autoescape=False,  # Markdown, escaped cell by cell with md_text / md_code
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["md"] = md_text
    env.filters["code"] = lambda v: md_code(v, in_table=False)
    return env.get_template(name)
