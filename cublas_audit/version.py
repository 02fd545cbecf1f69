"""The tool's version: one place, read by pyproject.toml, env.json and `--version`."""

__version__ = "0.1.0"
