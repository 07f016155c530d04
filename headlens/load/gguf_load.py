"""Converting a GGUF file into a Hugging Face folder of float32 weights with transformers' own GGUF mapping.

transformers' `load_gguf_checkpoint` (transformers.modeling_gguf_pytorch_utils) turns a GGUF's
metadata into a config and maps its tensors onto a model's parameter names (`blk.3.attn_q.weight`
-> `model.layers.3.self_attn.q_proj.weight`), undoing llama.cpp's q/k row permutation and Gemma's
`norm + 1`. It reads the file with `gguf.GGUFReader` and decodes blocks with `gguf.dequantize`,
both looked up on the `gguf` module when it runs.

`_torch_gguf` is the one place headlens changes that: for the duration of a conversion it puts
headlens.load.gguf_read's header reader and headlens.load.dequant's vectorized torch decoder in their place
(numpy's per-type decoders and per-entry views took most of a first load's time: BENCHMARKS.md).
Names, permutations, config and tokenizer are transformers' code, unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import NamedTuple

import torch

from headlens.errors import ModelLoadError
from headlens.load import dequant
from headlens.load.gguf_read import GGUFFile


class _Field:
    """What load_gguf_checkpoint reads of a `gguf.ReaderField`: `types`, `parts` and `data` (the
    indices of `parts` holding values), in the shapes `transformers.integrations.ggml._gguf_parse_value`
    decodes (a string as its bytes, a number wrapped in a list)."""

    def __init__(self, value, value_type):
        item_type = value_type[1] if isinstance(value_type, tuple) else value_type
        values = value if isinstance(value_type, tuple) else [value]
        self.types = list(value_type) if isinstance(value_type, tuple) else [value_type]
        self.parts = [item.encode("utf-8") if item_type == 8 else [item] for item in values]
        self.data = range(len(self.parts))


class _Tensor(NamedTuple):
    """What load_gguf_checkpoint reads of a `gguf.ReaderTensor`."""

    name: str
    data: object  # uint8 [..., row_bytes]
    tensor_type: int


class _Reader:
    """A `gguf.GGUFReader` stand-in over an already parsed header."""

    def __init__(self, parsed: GGUFFile):
        self.path = str(parsed.path)
        self.fields = {key: _Field(value, parsed.types[key]) for key, value in parsed.metadata.items()}
        self.tensors = [_Tensor(t.name, t.data, t.ggml_type) for t in parsed.tensors]


@contextlib.contextmanager
def _torch_gguf(parsed: GGUFFile):
    """Within the block, `gguf.GGUFReader(path)` returns the parsed header of `parsed` and
    `gguf.dequantize` is headlens.load.dequant.dequantize (the tensor-name table is memoized,
    transformers' tqdm bar is off, torch runs one intra-op thread). Restored on exit. Not thread-safe: the
    substitution is module-global, as the lookup inside transformers is."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    reader = _Reader(parsed)

    def open_reader(path, *args, **kwargs):
        if Path(path).resolve() != Path(reader.path).resolve():
            raise ModelLoadError(f"internal: asked to read {path} while converting {reader.path}")
        return reader

    saved = gguf.GGUFReader, gguf.dequantize, gguf.get_tensor_name_map, hf_gguf.tqdm, hf_gguf._gguf_parse_value
    gguf.GGUFReader, gguf.dequantize = open_reader, dequant.dequantize
    # load_gguf_checkpoint decodes every metadata value on each of its three calls (config, tensors,
    # tokenizer): a Gemma 3 vocabulary is 786,432 of them per call; each decoded once here
    hf_gguf._gguf_parse_value = _parsed_once(saved[4])
    # get_gguf_hf_weights_map rebuilds the (arch, n_layers) name table once per submodule
    # (hundreds of times); the table is a pure function of its arguments
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=4)(saved[2])
    hf_gguf.tqdm = lambda iterable, **kwargs: iterable  # its progress bar: the library never prints
    # One intra-op thread: the decode is many small memory-bound ops, and on a shared machine every
    # parallel region waits for a busy core (benchmarks/bench_load.py; BENCHMARKS.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.dequantize, gguf.get_tensor_name_map, hf_gguf.tqdm, hf_gguf._gguf_parse_value = saved
        torch.set_num_threads(threads)


def _parsed_once(parse):
    """`parse(part, types)` remembered per part object (a _Field's parts live as long as its
    _Reader, which the memo keeps alive with them): the same value, decoded once."""
    memo: dict[int, tuple[object, object]] = {}

    def parse_once(part, types):
        hit = memo.get(id(part))
        if hit is None or hit[0] is not part:
            hit = memo[id(part)] = (part, parse(part, types))
        return hit[1]

    return parse_once


def convert_gguf(parsed: GGUFFile, dest: Path) -> None:
    """Write `dest`/config.json, model.safetensors (float32) and the tokenizer files for `parsed`.

    Raises UnsupportedQuantError for a tensor type headlens.load.dequant lacks and ModelLoadError when
    transformers cannot map the architecture or leaves weights unmapped.
    """
    from safetensors.torch import save_file

    for tensor in parsed.tensors:
        dequant.check_supported_type(tensor.ggml_type, tensor.name)
    with _torch_gguf(parsed), _quiet():
        config, model = _config_and_skeleton(parsed)
        tensors = _mapped_tensors(parsed, model)
        tokenizer = _tokenizer(parsed)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: t.contiguous() for name, t in tensors.items()},
        str(dest / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def _config_and_skeleton(parsed: GGUFFile):
    """transformers' config for the file, and a weightless model of it (names only, for the mapping)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        config_dict = load_gguf_checkpoint(str(parsed.path), return_tensors=False)["config"]
        config = AutoConfig.for_model(**config_dict)
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise ModelLoadError(
            f"transformers cannot map the GGUF architecture {parsed.architecture!r} of "
            f"{parsed.path.name}: {_first_line(exc)}"
        ) from None
    config.dtype = torch.float32
    config.architectures = [type(model).__name__]  # peers (TransformerLens's bridge) pick their adapter by it
    return config, model


def _mapped_tensors(parsed: GGUFFile, model) -> dict[str, torch.Tensor]:
    """The file's tensors under the model's parameter names, float32; every weight accounted for."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        tensors = load_gguf_checkpoint(
            str(parsed.path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
        )["tensors"]
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise ModelLoadError(
            f"transformers cannot map the tensors of {parsed.path.name} ({parsed.architecture}): {_first_line(exc)}"
        ) from None
    tied = (model._tied_weights_keys or {}) if model.config.tie_word_embeddings else {}
    missing = sorted(set(model.state_dict()) - set(tensors) - set(tied))
    if missing:
        raise ModelLoadError(
            f"transformers maps no tensor of {parsed.path.name} to {len(missing)} weights of "
            f"its {parsed.architecture} model (e.g. {missing[0]}): unsupported layout"
        )
    return tensors


def _tokenizer(parsed: GGUFFile):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(parsed.path.parent), gguf_file=parsed.path.name)
    except Exception as exc:  # transformers' tokenizer builders raise many types
        raise ModelLoadError(f"cannot build a tokenizer from {parsed.path.name}: {_first_line(exc)}") from None


@contextlib.contextmanager
def _quiet():
    """transformers' conversion progress bar and info logs off: the library never prints."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
