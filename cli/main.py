"""`headlens` entry point. Bad input becomes one line on stderr and exit status 2, here: every
HeadlensError, every click usage error (unknown option, missing value), every OSError
(an output path that cannot be written, a file that cannot be read), and running out of memory.

Heavy imports (torch, transformers) stay inside command bodies so `headlens --help` is instant.
"""

from __future__ import annotations

import sys

import click

from headlens import __version__
from headlens.errors import HeadlensError

EXIT_BAD_INPUT = 2
OUT_OF_MEMORY = (
    "out of memory: the run needs more memory than this machine has free; lower --batch-size "
    "(or the probe sizes: --n-seq, --max-windows) and nothing already written was changed"
)


class HeadlensGroup(click.Group):
    """A click group that turns library errors into one clean line and exit 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            where = f" (see headlens {exc.ctx.info_name} --help)" if exc.ctx is not None and exc.ctx.parent else ""
            _fail(f"{exc.format_message()}{where}")
        except (HeadlensError, UnicodeDecodeError, OSError) as exc:
            _fail(str(exc))
        except MemoryError:
            _fail(OUT_OF_MEMORY)
        except RuntimeError as exc:  # torch reports a failed allocation as a RuntimeError subclass
            if type(exc).__name__ != "OutOfMemoryError" and "can't allocate memory" not in str(exc):
                raise
            _fail(OUT_OF_MEMORY)


def _fail(message: str) -> None:
    """One line on stderr, exit status 2."""
    click.echo(f"headlens: error: {' '.join(message.split())}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@click.group(cls=HeadlensGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="headlens")
def cli() -> None:
    """What does each attention head of this model do? Capture, classify, ablate, report."""


def _register() -> None:
    # Each command lives in its own module of headlens.cli; importing one must stay cheap.
    from headlens.cli import commands_substrate

    for command in commands_substrate.COMMANDS:
        cli.add_command(command)
    for module_name in ("commands_train", "commands_classify", "commands_ablate", "commands_report", "commands_pull"):
        try:
            module = __import__(f"headlens.cli.{module_name}", fromlist=["COMMANDS"])
        except ModuleNotFoundError as exc:
            if exc.name != f"headlens.cli.{module_name}":
                raise
            continue
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="headlens")


if __name__ == "__main__":
    main()
