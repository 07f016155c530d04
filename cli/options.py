"""Options every command shares, defined once: MODEL, --text, --format, --progress, and the helpers that
describe a run (the model's shape facts, the command line as typed).

MODEL is positional on every command that takes a model (`headlens ablate [MODEL] --heads ...`),
with `--model` kept as an alias. Values are checked by callbacks that raise headlens errors, so a
bad value is one line on stderr and exit 2 like every other bad input (cli.main).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys
from typing import TYPE_CHECKING

import click

from headlens.bounds import parse_count, shown
from headlens.errors import ConfigError
from headlens.reports.languages import check_lang

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

# --seed: what torch's generators take (torch.manual_seed: at most 2**64 - 1); beyond it, one usage line
SEED = click.IntRange(0, 2**64 - 1)
MAX_BATCH_SIZE = 1 << 20  # sequences per forward pass: far beyond any memory, so larger is a typo


def model_argument(default: str | None):
    """`[MODEL]` positional plus its `--model` alias; the command receives `model`. With
    `default=None` a model is required."""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, model=None, model_option=None, **kwargs):
            if model is not None and model_option is not None and model != model_option:
                raise ConfigError(f"two models given: MODEL {shown(model)} and --model {shown(model_option)}")
            chosen = model if model is not None else model_option if model_option is not None else default
            if chosen is None:
                raise ConfigError("no model given: pass MODEL (a shipped name such as tiny, a directory or a hub id)")
            return func(*args, model=chosen, **kwargs)

        default_note = f" [default: {default}]" if default is not None else ""
        wrapper = click.option(
            "--model", "model_option", default=None, metavar="MODEL", help=f"alias of the MODEL argument{default_note}"
        )(wrapper)
        return click.argument("model", required=False, default=None, metavar="[MODEL]" if default else "MODEL")(wrapper)

    return decorate


def format_option(*choices: str, default: str = "table"):
    """`--format` with the same check on every command (one-line error naming the choices)."""

    def check(ctx, param, value):
        if value not in choices:
            raise ConfigError(f"unknown format {shown(value)}: choose one of {', '.join(choices)}")
        return value

    return click.option(
        "--format",
        "fmt",
        default=default,
        show_default=True,
        callback=check,
        metavar="|".join(choices),
        help=" | ".join(choices),
    )


def progress_option(func):
    """`--progress/--no-progress`; the command receives a bool: by default, whether stderr is a terminal."""

    def resolve(ctx, param, value):
        return sys.stderr.isatty() if value is None else value

    return click.option(
        "--progress/--no-progress",
        default=None,
        callback=resolve,
        help="progress bars on stderr [default: when stderr is a terminal]",
    )(func)


def lang_option(func):
    """`--lang en|es`: the language of the HTML report's prose (headlens.reports.languages.LANGS)."""

    def check(ctx, param, value):
        return check_lang(value)

    return click.option(
        "--lang", default="en", show_default=True, callback=check, metavar="en|es", help="language of the HTML report"
    )(func)


def text_option(use: str, default: str = "headlens's held-out text, the same for every model"):
    """`--text PATH`, the same on every command: a UTF-8 text file, a folder of .txt files or a
    .jsonl with a text field, read by headlens.probes.corpus.open_text; the command receives `text_path`."""
    return click.option(
        "--text",
        "text_path",
        type=click.Path(path_type=str),
        default=None,
        metavar="PATH",
        help=f"UTF-8 text file, folder of .txt files, or .jsonl with a text field: {use} [default: {default}]",
    )


def model_info(loaded: LoadedModel) -> dict:
    """The shape facts a report and an output file describe a model by (headlens.reports.facts.model_info)."""
    from headlens.reports.facts import model_info as shape_facts  # report code only when a command needs it

    return shape_facts(loaded)


def command_line(ctx, keep: tuple[str, ...] = ()) -> str:
    """The command as typed: every parameter the user gave on the command line (click's parameter source),
    with its value as parsed, so a rerun is the same run; defaults are left to the defaults, except the
    parameters named in `keep` (a report names the file it was written to)."""
    from click.core import ParameterSource

    words = ["headlens", ctx.info_name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        typed = ctx.get_parameter_source(param.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        given = typed or param.name in keep
        if not given or value is None or param.name == "progress":
            continue
        if isinstance(param, click.Argument):
            words.append(str(value))
        elif getattr(param, "is_flag", False):
            if value or param.secondary_opts:  # --bos/--no-bos: the side the user chose
                words.append(param.opts[0] if value else param.secondary_opts[0])
        else:
            for item in value if isinstance(value, tuple) else (value,):
                words += [param.opts[0], str(item)]
    return shlex.join(words)


def placement_options(func):
    """`--device`, `--dtype`, `--device-map`, `--max-memory`, `--offload-folder`, the same on every
    command that loads a model; the command receives `placement`, the keyword arguments of
    headlens.load.models.load_model. Under torchrun the process joins its distributed job here, each
    rank of a multi-GPU job takes its own GPU, and only rank 0's stdout is shown (commands also
    write files from rank 0 only)."""

    @functools.wraps(func)
    def wrapper(*args, device, dtype, device_map, max_memory, offload_folder, **kwargs):
        from headlens import distributed

        distributed.init()
        placement = {
            "device": distributed.local_device(device),
            "dtype": dtype,
            "device_map": device_map,
            "max_memory": parse_max_memory(max_memory),
            "offload_folder": offload_folder,
        }
        kwargs["placement"] = placement
        if distributed.is_main():
            return func(*args, **kwargs)
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # rank 0 alone prints
            return func(*args, **kwargs)

    options = [
        click.option(
            "--device",
            default=None,
            metavar="DEVICE",
            help="cpu, cuda, cuda:N or mps [default: the GPU when present, else cpu]",
        ),
        click.option(
            "--dtype",
            default="float32",
            show_default=True,
            metavar="DTYPE",
            help="float32, bfloat16 or float16 (scores are accumulated in float32 either way)",
        ),
        click.option(
            "--device-map",
            default=None,
            metavar="MAP",
            help="auto: spread the layers over GPUs, CPU and disk with accelerate (overrides --device)",
        ),
        click.option(
            "--max-memory",
            default=None,
            metavar="DEV=SIZE,...",
            help="with --device-map: memory per device, e.g. 0=20GiB,cpu=60GiB",
        ),
        click.option(
            "--offload-folder",
            default=None,
            metavar="DIR",
            help="with --device-map: where weights offloaded to disk go",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def tokens_option(default: str):
    """`--tokens N|all`: the token budget of an ablation (headlens.intervene.evalspec); the command
    receives `tokens` (a string, or None for its default, `default`, named in the help)."""
    return click.option(
        "--tokens",
        "tokens",
        default=None,
        metavar="N|all",
        help="tokens of the evaluation set to read (whole sequences, evenly spaced); all: every one "
        f"[default: {default}]",
    )


def batch_size_option(default: int | str):
    """`--batch-size N|auto` for commands that batch their work; the command receives `batch_size`
    (int, "auto", or None for its default, `default`, named in the help: a number or words)."""
    return click.option(
        "--batch-size",
        default=None,
        metavar="N|auto",
        callback=lambda ctx, param, value: parse_batch_size(value),
        help="sequences per forward pass; auto: the largest that fits, halving on "
        f"out-of-memory (the choice is reported) [default: {default}]",
    )


def parse_batch_size(value: str | None) -> int | str | None:
    """`--batch-size`: a positive integer, `auto`, or None (the command's default)."""
    if value is None or value == "auto":
        return value
    size = parse_count(value)
    if size is None or not 1 <= size <= MAX_BATCH_SIZE:
        raise ConfigError(
            f"--batch-size {shown(value)} is invalid: give an integer from 1 to {MAX_BATCH_SIZE:,} or auto"
        )
    return size


def parse_max_memory(value: str | None) -> dict | None:
    """`0=20GiB,cpu=60GiB` -> {0: "20GiB", "cpu": "60GiB"} (accelerate's max_memory: GPU indices as
    ints, "cpu", "disk"); None stays None."""
    if value is None:
        return None
    limits = {}
    for pair in value.split(","):
        name, sep, size = pair.strip().partition("=")
        name = name.strip().removeprefix("cuda:")
        index = parse_count(name)
        if not sep or not size.strip() or not (index is not None or name in ("cpu", "disk", "mps")):
            raise ConfigError(
                f"--max-memory {shown(value)} is malformed: give DEVICE=SIZE pairs such as 0=20GiB,cpu=60GiB"
            )
        limits[index if index is not None else name] = size.strip()
    return limits


def out_option(*suffixes: str, default: str | None = None, what: str = "the result"):
    """`--out FILE`, the same on every command: one file, its format read from its suffix (`suffixes`, e.g.
    ".csv", ".json", ".html"; headlens.files.out_format). The command receives `out` and checks it with
    check_out before any work; --out never names a folder (that is --out-dir)."""
    suffix_list = ", ".join(suffixes)
    return click.option(
        "--out",
        "out",
        default=default,
        show_default=default is not None,
        type=click.Path(path_type=str),
        metavar="FILE",
        help=f"file to write {what} to, as its suffix says ({suffix_list}), replaced atomically; stdout then "
        "gets a short summary",
    )


def check_out(path: str | None, suffixes: tuple[str, ...], lang: str = "en") -> str | None:
    """The format of `--out FILE` ("csv", "json", "html"; None when no --out), checked before any work: a
    folder, link, device, FIFO or socket there is refused (headlens.reports.render.check_output_path, in
    `lang`), and so is a suffix other than `suffixes`; each in one line naming --out."""
    if path is None:
        return None
    from headlens.files import out_format, special_kind
    from headlens.reports.render import check_output_path  # the same checks as every page's path

    if special_kind(path) is not None:  # what is there is named before what its suffix says
        check_output_path(path, lang, option="--out")
    fmt = out_format(path, suffixes)
    check_output_path(path, lang, option="--out")  # its folder made and writable
    return fmt


def html_pages(report_path: str | None, out: str | None, out_fmt: str | None) -> list[str]:
    """The HTML pages a command writes: `--report PATH`'s, and `--out FILE`'s when it names a .html file."""
    return [page for page in (report_path, out if out_fmt == "html" else None) if page is not None]


def say_written(written, out: str | None, summary: str) -> None:
    """A page written: `--out`'s with the command's summary on stdout, `--report`'s as a note on stderr."""
    if str(written) == str(out):
        click.echo(f"{summary}; wrote {written}")
    else:
        click.echo(f"headlens: wrote {written}", err=True)


def out_dir_option(name: str, help: str, **kwargs):
    """`--out-dir DIR`, a folder the command writes several files into; the command receives it as `name`."""
    return click.option("--out-dir", name, metavar="DIR", help=help, **kwargs)


def seed_option(help: str, default: int | None = 0):
    """`--seed N` (0 .. 2**64 - 1, what torch's generators take); `help` says what it seeds."""
    return click.option("--seed", default=default, show_default=default is not None, type=SEED, help=help)


def labels_option(help: str):
    """`--labels FILE`, heads.json from `headlens classify --out-dir`; the command receives `labels_path`."""
    return click.option("--labels", "labels_path", type=click.Path(dir_okay=False), default=None, help=help)


def prompts_option(help: str):
    """`--prompts FILE`, a JSONL of prompts (headlens.intervene.evalset.read_prompts); the command receives
    `prompts_path`."""
    return click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False), default=None, help=help)


def report_option(help: str = "also write an HTML report", path_type: type | None = None):
    """`--report PATH`, an HTML page written besides the command's output; the command receives `report_path`
    and checks it with check_report before any work."""
    return click.option("--report", "report_path", default=None, type=click.Path(path_type=path_type), help=help)


def check_report(path: str | None, lang: str) -> None:
    """`--report PATH` checked before any work (headlens.reports.render.check_output_path, in `lang`)."""
    if path is not None:
        from headlens.reports.render import check_output_path

        check_output_path(path, lang, option="--report")
