"""Rendering what was judged: Markdown, terminal, plots, reports of each kind."""
