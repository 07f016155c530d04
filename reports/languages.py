"""The languages headlens writes prose in: HTML reports, inline views and the CLI's `--lang`.

A module of its own, which imports only the error classes, so that checking a `--lang` value (every command
that writes a page) loads no report code: headlens.reports re-exports its names lazily.
"""

from __future__ import annotations

from headlens.errors import ConfigError

LANGS = ("en", "es")  # languages a report can be written in; the first is the default
DEFAULT_LANG = LANGS[0]


def check_lang(lang: str) -> str:
    """`lang` if it is one of LANGS, else ConfigError naming the choices."""
    if lang not in LANGS:
        raise ConfigError(f"unknown report language {lang!r}: choose one of {', '.join(LANGS)}")
    return lang
