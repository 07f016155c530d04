"""The handle every public function takes: a `LoadedModel` named `loaded` (headlens.load.models), the first
argument, from which the adapter is reached (`loaded.adapter`). Walks `headlens.__all__`, every stage package's
`__all__` (each package under headlens/) and headlens.reports's, and reads each public function's signature."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import headlens
from headlens.load.models import LoadedModel

# Parameter names that mean a bare Hugging Face model or an adapter where a loaded model is meant.
BARE = ("model", "adapter")
# The stages below the handle: `LoadedModel` is built from them, and they work on the torch module itself.
BELOW_THE_HANDLE = {
    "headlens.arch": "the adapters: built from a Hugging Face model (LoadedModel.adapter is one of them)",
    "headlens.capture": "runs on any torch module with the capture sites, a TransformerLens bridge included",
}


def public_packages() -> list[str]:
    stages = [f"headlens.{m.name}" for m in pkgutil.iter_modules(headlens.__path__) if m.ispkg]
    return ["headlens", *sorted(stages), "headlens.reports"]


def public_functions(package: str) -> list[tuple[str, object]]:
    module = importlib.import_module(package)
    named = [(f"{package}.{name}", getattr(module, name)) for name in getattr(module, "__all__", [])]
    return [(name, obj) for name, obj in named if inspect.isfunction(obj)]


def handle_problems(name: str, function) -> list[str]:
    """What is wrong with `function`'s model parameter, if anything: [] for a function that takes no model or
    takes `loaded` first."""
    params = list(inspect.signature(function).parameters)
    bare = [p for p in params if p in BARE]
    problems = [f"{name}({p}=...): take `loaded`, a LoadedModel, and reach the adapter from it" for p in bare]
    if "loaded" in params and params[0] != "loaded":
        problems.append(f"{name}: `loaded` is argument {params.index('loaded') + 1}, not the first")
    return problems


@pytest.mark.parametrize("package", [p for p in public_packages() if p not in BELOW_THE_HANDLE])
def test_every_public_function_takes_a_loaded_model_first(package):
    problems = [problem for name, function in public_functions(package) for problem in handle_problems(name, function)]
    assert not problems, "\n".join(problems)


def test_the_walk_reaches_the_front_door_and_every_stage():
    packages = public_packages()
    assert set(BELOW_THE_HANDLE) < set(packages)  # the exemptions name real packages
    assert {"headlens.load", "headlens.classify", "headlens.ablation", "headlens.circuits"} < set(packages)
    names = {name for package in packages for name, _ in public_functions(package)}
    assert {"headlens.circuit", "headlens.self_repair", "headlens.classify_heads", "headlens.ablate_heads"} <= names


def test_the_check_catches_a_bare_model_or_adapter():
    def takes_model(model, heads): ...

    def takes_adapter(adapter): ...

    def takes_loaded_late(heads, loaded): ...

    def takes_loaded(loaded, heads): ...

    assert handle_problems("takes_model", takes_model) and handle_problems("takes_adapter", takes_adapter)
    assert handle_problems("takes_loaded_late", takes_loaded_late)
    assert handle_problems("takes_loaded", takes_loaded) == []


def test_the_adapter_is_reached_from_the_loaded_model_and_the_model_is_left_alone(small_model):
    from headlens.arch import adapter_for

    before = set(vars(small_model.model))
    adapter = small_model.adapter
    assert adapter is small_model.adapter and adapter.model is small_model.model  # built once, of this model
    assert type(adapter_for(small_model.model)) is type(adapter)
    assert set(vars(small_model.model)) == before  # nothing cached on the Hugging Face model
    assert isinstance(small_model, LoadedModel)
