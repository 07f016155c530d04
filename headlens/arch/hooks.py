"""Scoped hooks: the one way headlens hooks a model.

Hooks are global state on the modules (TransformerLens docs), so they live only inside a
`Hooks` context, as in TransformerLens's `HookedRootModule.hooks()`: every hook added through it
is removed on exit, error or not, in reverse order of registration. The context also carries
the batch being run (`hooks.batch`, set by whoever runs the forward passes), so a hook that
needs the batch's padding mask reads it there.

    with adapter.hooks() as hooks:
        hooks.z(layer, fn)                  # z [batch, pos, head, d_head] (Adapter.hook_z)
        hooks.qkv(layer, fn)                # q, k, v as the attention uses them (Adapter.hook_qkv)
        hooks.output(module, fn)            # fn(output) -> replacement or None
        hooks.enter(bridge.hooks(...))      # another scoped context (a TransformerLens bridge's)
        for batch in batches:
            hooks.batch = batch
            model(...)
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn


class Hooks(contextlib.AbstractContextManager):
    """Hooks registered through it are removed when the context exits; `batch` is the current batch."""

    def __init__(self, adapter=None):
        self.adapter = adapter  # headlens.arch.Adapter for z / qkv hooks; None for module hooks only
        self.batch: Any = None  # the batch being run (headlens.capture.Batch), set by the caller
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Hooks:
        self._stack.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self.batch = None
        return self._stack.__exit__(*exc)

    def add(self, handle):
        """Own a handle (or a list of handles) from `register_forward_*hook`: removed on exit."""
        for one in handle if isinstance(handle, list) else [handle]:
            self._stack.callback(one.remove)
        return handle

    def enter(self, context):
        """Enter another context manager for the lifetime of this one (a bridge's `hooks()`)."""
        return self._stack.enter_context(context)

    def z(self, layer: int, fn) -> None:
        """fn(z), z [batch, pos, head, d_head] at the z site of `layer`; a tensor it returns replaces z."""
        self.add(self.adapter.hook_z(layer, fn))

    def qkv(self, layer: int, fn) -> None:
        """fn(q, k, v) once per forward of `layer`, q [batch, head, pos, d_head], k and v
        [batch, kv_head, pos, d_head], after rotary and q/k norms."""
        self.add(self.adapter.hook_qkv(layer, fn))

    def output(self, module: nn.Module, fn) -> None:
        """fn(output) after `module` runs; a value it returns replaces the output."""
        self.add(module.register_forward_hook(lambda module, args, output: fn(output)))
