"""How headlens's modules import each other: one way through the stages, no cycles, and a light data path
for `headlens ablate` (no report, classify or scorer code).

The graph is read from the source with `ast`: every `import headlens...` / `from headlens... import` of
headlens/, cli/ (installed as headlens.cli) and reports/ (headlens.reports)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"headlens": ROOT / "headlens", "headlens.cli": ROOT / "cli", "headlens.reports": ROOT / "reports"}

# The stages are the folders: every package directly under headlens/ is one (its folder name is the stage), and
# so are cli/ and reports/ (installed as headlens.cli and headlens.reports); headlens's top-level modules (errors,
# heads, files, distributed, ...) are the core every stage reads. Their order is the README's list of stage
# folders (between STAGES_BEGIN and STAGES_END), which the tests below check against the folders and the imports.
README = ROOT / "README.md"
STAGES_BEGIN, STAGES_END = "<!-- stages -->", "<!-- stages end -->"
CORE = "core"
# `headlens ablate --model tiny --heads 1.0` loads at most this many headlens code modules (a stage folder's
# docstring-only __init__ runs no code and is not counted): the CLI shell (headlens.cli, main, allocator, options
# with the report languages: headlens.reports.languages, under the reports package's lazy __init__, which loads no
# page code (REPORTS_ON_ABLATE_PATH); commands_ablate, the corpus reader); loading (headlens with its lazy
# re-exports (headlens.lazy), errors, heads, devices, distributed, files,
# mha, models, hub's local-folder check, arch with its base, context, hooks, sites, kernels (the no-pattern
# forward's fused attention and oneDNN products) and the GPT-2 adapter only);
# the capture reducers (padding) and the probes' inputs (the evaluation text, tokenized in pieces: tokenize); the
# exact ablation (request, the command's one entry point with its checks on combinations of flags; ablate,
# classify's roles with the kinds registry's labels, store; intervene's evalset, metrics, replace, stats, sums, and
# stacked: the controls' runs from one cached residual; evalspec, the evaluation set as one value with its token
# budget; estimate, the time left; clean, with the core's cache module headlens.cache, for the clean run's losses)
# and bounds (a config's shape checked on load). Not on it: the
# GGUF sources (named models, ollama, reading and dequantizing), the capture run and bridge, the gradient
# estimates and pruning.
MAX_ABLATE_MODULES = 46
# Modules the ablate data path never needs, but the reports' languages (`--lang` is checked on every command that
# writes a page) and the package above them.
REPORTS_ON_ABLATE_PATH = ("headlens.reports", "headlens.reports.languages")
NOT_ON_ABLATE_PATH = ("headlens.reports", "headlens.scores", "headlens.classify.frame", "headlens.classify.labels",
                      "headlens.classify.runs", "headlens.classify.kind_runs", "headlens.training",
                      "headlens.cli.commands_classify", "headlens.cli.commands_report", "headlens.arch.llama",
                      "headlens.load.locate", "headlens.load.pulls", "headlens.load.ollama",
                      "headlens.load.gguf_read", "headlens.load.gguf_load", "headlens.load.dequant",
                      "headlens.capture.run", "headlens.capture.bridge", "headlens.ablation.approx",
                      "headlens.ablation.gradients", "headlens.ablation.prune")  # fmt: skip


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            if package == "headlens" and parts and parts[0] in ("cli", "reports", "data"):
                continue
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known, top_only: bool) -> set[str]:
    """The headlens modules `name` imports: at module level only (`top_only`), or anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_only else list(ast.walk(tree))
    if top_only:  # module-level imports inside `if`/`try` blocks count, TYPE_CHECKING blocks do not
        nodes = [n for node in nodes for n in _flatten(node)]
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(
                    base.split(".")[: len(base.split(".")) - node.level + 1] + ([module] if module else [])
                )
            # `from P import x`: the submodule P.x when x is one (P itself is its parent, imported first by
            # Python, as for any submodule), else P.
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _flatten(node):
    if isinstance(node, ast.If):
        if "TYPE_CHECKING" in ast.unparse(node.test):
            return []
        return [n for child in node.body + node.orelse for n in _flatten(child)]
    if isinstance(node, ast.Try):
        return [n for child in node.body for n in _flatten(child)]
    return [node]


def stage(name: str) -> str:
    """The stage of a headlens module: its folder under headlens/ (or cli, reports), else the core."""
    parts = name.split(".")
    if len(parts) >= 2 and (parts[1] in ("cli", "reports") or (ROOT / "headlens" / parts[1]).is_dir()):
        return parts[1]
    return CORE


def folders() -> set[str]:
    """The stage folders on disk: packages directly under headlens/ (data is package data), cli and reports."""
    found = {p.name for p in (ROOT / "headlens").iterdir() if (p / "__init__.py").is_file()}
    return found | {"cli", "reports"}


def readme_stages() -> list[str]:
    r"""The README's stage folders in data-flow order: the `- \`name/\`` items between the two markers."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index(STAGES_BEGIN) : text.index(STAGES_END)]
    return [line.split("`")[1].rstrip("/") for line in block.splitlines() if line.startswith("- `")]


# The top-level package is the front door: it re-exports every stage's entry point, each imported when first
# used (its LAZY table; `show` and `show_attention` import headlens.reports.inline when called), so `import
# headlens` loads no stage (tests/test_inline.py). It is the one module whose imports reach later stages.
FRONT_DOOR = "headlens"


def test_the_readme_lists_every_stage_folder_once():
    listed = readme_stages()
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == folders()


def test_every_module_imports_the_core_its_own_stage_or_an_earlier_one():
    """The order is the README's list; the core imports no stage (but for the front door's `show`)."""
    order = {name: index for index, name in enumerate([CORE, *readme_stages()])}
    known = modules()
    later = [
        f"{name} ({stage(name)}) imports {other} ({stage(other)})"
        for name, path in known.items()
        for other in imports(name, path, known, top_only=False)
        if order[stage(other)] > order[stage(name)] and name != FRONT_DOOR
    ]
    assert later == []


# Stages that stand side by side although the README lists one before the other: neither may import the other.
# Both circuits and ablation build on intervene/ (the engine that replaces heads' outputs and evaluates tasks).
SIDE_BY_SIDE = (("circuits", "ablation"),)


@pytest.mark.parametrize(("stage_name", "other_stage"), SIDE_BY_SIDE)
def test_side_by_side_stages_do_not_import_each_other(stage_name, other_stage):
    known = modules()
    crossing = [
        f"{name} imports {other}"
        for name, path in known.items()
        for other in imports(name, path, known, top_only=False)
        if {stage(name), stage(other)} == {stage_name, other_stage}
    ]
    assert crossing == []


def test_module_level_imports_have_no_cycle():
    known = modules()
    graph = {name: imports(name, path, known, top_only=True) for name, path in known.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycles.append(path[path.index(other) :] + [other])
            elif other not in state:
                visit(other, path + [other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


@pytest.mark.slow  # a subprocess loads the tiny model and ablates a head
def test_ablate_data_path_is_light():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from headlens.cli.main import cli\n"
        "result = CliRunner().invoke(cli, ['ablate', '--model', 'tiny', '--heads', '1.0'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(' '.join(sorted(m for m in sys.modules if m == 'headlens' or m.startswith('headlens.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    loaded = out.split()
    assert "headlens.ablation.ablate" in loaded  # the run happened
    assert [m for m in loaded if m.startswith(NOT_ON_ABLATE_PATH) and m not in REPORTS_ON_ABLATE_PATH] == []
    code = [m for m in loaded if not is_folder_only(m)]
    assert len(code) <= MAX_ABLATE_MODULES, code


def is_folder_only(name: str) -> bool:
    """A stage folder's `__init__` that holds only its docstring: it names the folder and runs no code."""
    path = modules()[name]
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return path.name == "__init__.py" and all(isinstance(node, ast.Expr) for node in body)


# Packages whose __init__ re-exports some public names lazily (a `LAZY` table read by the module's __getattr__).
LAZY_PACKAGES = (
    "headlens",
    "headlens.ablation",
    "headlens.capture",
    "headlens.classify",
    "headlens.reports",
    "headlens.validate",
)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_lazy_re_exports_are_the_modules_names(package):
    """Every public name resolves to its defining module's object, and the LAZY table is the TYPE_CHECKING
    imports that type checkers read (headlens.lazy.lazy_exports), not a second listing that could drift."""
    module = importlib.import_module(package)
    assert set(module.LAZY) <= set(module.__all__)
    for name in module.__all__:
        value = getattr(module, name)
        if name in module.LAZY:
            assert value is getattr(importlib.import_module(f"{package}.{module.LAZY[name]}"), name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018
    tree = ast.parse(modules()[package].read_text(encoding="utf-8"))
    checked = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    typed = {alias.name: node.module for block in checked for node in block.body for alias in node.names}
    assert typed == {name: f"{package}.{source}" for name, source in module.LAZY.items()}
    assert "LAZY = {" not in modules()[package].read_text(encoding="utf-8")  # read from the imports, not retyped


# What the README says scores/ holds: modules whose functions take tensors only, and modules that read a model
# (a parameter named for one). Each module is in exactly one of the README's two lists, and in the right one.
MODEL_PARAMETERS = {"model", "loaded", "adapter"}


def readme_scores_lists() -> tuple[set[str], set[str]]:
    r"""The README's `scores/` item: the modules named before "The others" (tensors only) and after it."""
    block = README.read_text(encoding="utf-8")
    item = block[block.index("- `scores/`") : block.index("- `classify/`")]
    tensors, _, models = item.partition("The\n  others")
    names = lambda text: {word for word in text.split("`")[1::2] if word.isidentifier()}  # noqa: E731
    return names(tensors), names(models) - MODEL_PARAMETERS


def test_scores_modules_are_where_the_readme_says():
    on_disk = {p.stem for p in (ROOT / "headlens" / "scores").glob("*.py") if p.stem != "__init__"}
    tensors, models = readme_scores_lists()
    assert tensors | models == on_disk and not tensors & models
    for name in on_disk:
        tree = ast.parse((ROOT / "headlens" / "scores" / f"{name}.py").read_text(encoding="utf-8"))
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        taken = {arg.arg for fn in functions for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        assert bool(taken & MODEL_PARAMETERS) == (name in models), name
