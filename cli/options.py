"""Options every command shares, defined once: MODEL, --format, --progress, and the helpers that
describe a run (the model's shape facts, the command line as typed).

MODEL is positional on every command that takes a model (`headlens ablate [MODEL] --heads ...`),
with `--model` kept as an alias. Values are checked by callbacks that raise headlens errors, so a
bad value is one line on stderr and exit 2 like every other bad input (cli.main).
"""

from __future__ import annotations

import functools
import shlex
import sys

import click

from headlens.errors import ConfigError


def model_argument(default: str | None):
    """`[MODEL]` positional plus its `--model` alias; the command receives `model`. With
    `default=None` a model is required."""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, model=None, model_option=None, **kwargs):
            if model is not None and model_option is not None and model != model_option:
                raise ConfigError(f"two models given: MODEL {model!r} and --model {model_option!r}")
            chosen = model if model is not None else model_option if model_option is not None else default
            if chosen is None:
                raise ConfigError("no model given: pass MODEL (a shipped name such as tiny, a directory or a hub id)")
            return func(*args, model=chosen, **kwargs)

        shown = f" [default: {default}]" if default is not None else ""
        wrapper = click.option("--model", "model_option", default=None, metavar="MODEL",
                               help=f"alias of the MODEL argument{shown}")(wrapper)
        return click.argument("model", required=False, default=None, metavar="[MODEL]" if default else "MODEL")(
            wrapper)

    return decorate


def format_option(*choices: str, default: str = "table"):
    """`--format` with the same check on every command (one-line error naming the choices)."""

    def check(ctx, param, value):
        if value not in choices:
            raise ConfigError(f"unknown format {value!r}: choose one of {', '.join(choices)}")
        return value

    return click.option("--format", "fmt", default=default, show_default=True, callback=check,
                        help=" | ".join(choices))


def progress_option(func):
    """`--progress/--no-progress`; the command receives a bool: by default, whether stderr is a terminal."""

    def resolve(ctx, param, value):
        return sys.stderr.isatty() if value is None else value

    return click.option("--progress/--no-progress", default=None, callback=resolve,
                        help="progress bars on stderr [default: when stderr is a terminal]")(func)


def model_info(loaded) -> dict:
    """The shape facts a report and an output file describe a model by."""
    spec = loaded.spec
    return {"name": str(loaded.name), "family": spec.family, "n_layers": spec.n_layers, "n_heads": spec.n_heads,
            "n_kv_heads": spec.n_kv_heads or spec.n_heads, "d_head": spec.d_head, "d_model": spec.d_model,
            "n_ctx": spec.n_ctx, "n_params": spec.n_params}


def command_line(ctx) -> str:
    """The command as typed, rebuilt from click's parsed parameters (non-default values only)."""
    words = ["headlens", ctx.info_name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or value is False or value == param.default or value == ():
            continue
        if param.name == "progress":
            continue
        if isinstance(param, click.Argument):
            words.append(str(value))
        elif value is True:
            words.append(param.opts[0])
        else:
            for item in value if isinstance(value, tuple) else (value,):
                words += [param.opts[0], str(item)]
    return shlex.join(words)
