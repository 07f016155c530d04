"""`headlens` entry point. Bad input becomes one line on stderr and exit status 2, here: every
HeadlensError, every click usage error (unknown option, missing value), every OSError
(an output path that cannot be written, a file that cannot be read), and running out of memory. Any other
exception is a bug or an unchecked input: one line naming its type, the traceback only with HEADLENS_DEBUG=1.

Heavy imports (torch, transformers) stay inside command bodies so `headlens --help` is instant, and
each command's module is imported only when that command runs or is listed (click's lazily loaded
subcommands: `LAZY_COMMANDS`), so `headlens ablate` loads no classify, report or training code.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from headlens import __version__
from headlens.bounds import printable
from headlens.cli.allocator import keep_freed_memory
from headlens.errors import HeadlensError

EXIT_BAD_INPUT = 2
MAX_LINE = 300  # characters of an error line
OUT_OF_MEMORY = (
    "out of memory: the run needs more memory than this machine has free; lower --batch-size "
    "(or the probe sizes: --n-seq, --max-windows) and nothing already written was changed"
)


# command name -> the headlens.cli module whose COMMANDS list holds it, imported on first use.
LAZY_COMMANDS = {
    "heads": "commands_substrate",
    "validate": "commands_substrate",
    "train-tiny": "commands_train",
    "classify": "commands_classify",
    "ablate": "commands_ablate",
    "prune": "commands_ablate",
    "report": "commands_report",
    "pull": "commands_pull",
    "explore": "commands_explore",
    "circuit": "commands_circuit",
    "cache": "commands_cache",
}


class HeadlensGroup(click.Group):
    """A click group that loads its commands lazily (LAZY_COMMANDS, as click's documentation on lazily
    loading subcommands shows) and turns library errors into one clean line and exit 2."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx, cmd_name):
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module = importlib.import_module(f"headlens.cli.{LAZY_COMMANDS[cmd_name]}")
            for command in module.COMMANDS:
                self.add_command(command)
        return super().get_command(ctx, cmd_name)

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
        except (click.exceptions.Exit, click.exceptions.Abort):  # click's own (RuntimeError subclasses)
            raise
        except RuntimeError as exc:  # torch reports a failed allocation as a RuntimeError subclass
            if type(exc).__name__ != "OutOfMemoryError" and "can't allocate memory" not in str(exc):
                _unexpected(exc)
            _fail(OUT_OF_MEMORY)
        except Exception as exc:
            _unexpected(exc)
        except BaseException as exc:  # a Rust library's panic (pyo3's PanicException) is a BaseException
            if type(exc).__name__ != "PanicException":
                raise
            _unexpected(exc)


def _unexpected(exc: BaseException) -> None:
    """Defence in depth: an error no check foresaw is one line naming its type, not a traceback (the bad input
    it came from should have been refused where it was read); HEADLENS_DEBUG=1 lets the traceback through."""
    if os.environ.get("HEADLENS_DEBUG") == "1":
        raise exc
    _fail(
        f"unexpected {type(exc).__name__}: {str(exc)[:120]} (a bug or an input headlens did not check; "
        "HEADLENS_DEBUG=1 shows the traceback)"
    )


def _fail(message: str) -> None:
    """One line on stderr of at most MAX_LINE characters, exit status 2."""
    line = f"headlens: error: {printable(' '.join(message.split()))}"
    click.echo(line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "...", err=True)
    sys.exit(EXIT_BAD_INPUT)


@click.group(cls=HeadlensGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="headlens")
def cli() -> None:
    """What does each attention head of this model do? Capture, classify, ablate, report."""


def main() -> None:
    keep_freed_memory()  # tensors of a forward pass reuse freed memory instead of page-faulting it in again
    cli(prog_name="headlens")


if __name__ == "__main__":
    main()
