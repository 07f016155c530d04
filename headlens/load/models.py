"""Loading causal language models: hub ids, local Hugging Face directories (found and checked by
headlens.load.hub), the models we ship, and GGUF files (headlens.load.locate: named models, `ollama:`,
`.gguf` paths), read from the float folder they are dequantized into once. A shipped name is the
shipped model: headlens.load.locate is imported only for the other names.

Every model comes back in eager attention, because sdpa/flash never materialise the
attention pattern (transformers 5 defaults to sdpa). Shape facts always come from the
architecture adapter (headlens.arch), never from GPT-2 small's 12 x 12. A `model_type` without
an adapter is refused with one line naming the supported families.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from headlens.arch import Adapter, adapter_for, check_supported, kv_group
from headlens.errors import ModelLoadError
from headlens.files import read_json, shipped_path
from headlens.load.devices import onloaded, placement_kwargs, resolve_device, resolve_dtype, tensor_checksum
from headlens.load.hub import check_local_dir, resolve_hub

if TYPE_CHECKING:  # annotations only: transformers is imported where a model is built or read
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from headlens.load.locate import ModelSource

# Short names for models that ship inside the package (headlens/data/<name>).
SHIPPED_MODELS = {"tiny": "tiny", "tiny-gqa": "tiny-gqa"}


@dataclass(frozen=True)
class ModelSpec:
    """Shape facts of a loaded model, in TransformerLens vocabulary."""

    n_layers: int  # transformer blocks
    n_heads: int  # attention (query) heads per block
    d_model: int  # residual stream width
    d_head: int  # width of one head's query, key, value and z
    n_ctx: int  # maximum sequence length
    d_vocab: int  # vocabulary size of the unembedding
    n_params: int  # parameter count (tied embeddings counted once)
    n_kv_heads: int  # key/value heads per block (GQA/MQA: fewer than n_heads)
    family: str  # the architecture adapter's family (the config's model_type)

    def kv_group(self, head: int) -> int:
        """The key/value head that query head `head` reads (headlens.arch.kv_group)."""
        return kv_group(head, self.n_heads, self.n_kv_heads)


@dataclass
class LoadedModel:
    """A model, its tokenizer, its shape facts and where it came from."""

    model: PreTrainedModel  # a transformers causal LM of a supported family, eval mode, eager attention
    tokenizer: PreTrainedTokenizerBase  # a transformers tokenizer
    spec: ModelSpec
    name: str  # what the user asked for ("gpt2", "tiny", a path)
    path: Path | None = None  # the local directory the weights were read from, if any
    display_name: str = ""  # a short name for titles ("smollm2", a folder's name); "" -> `name`
    source: ModelSource | None = None  # the GGUF the weights were dequantized from, if any
    _adapter: Adapter | None = field(default=None, init=False, repr=False, compare=False)  # `adapter`'s

    def __post_init__(self):
        if not self.display_name:
            self.display_name = str(self.name)

    @property
    def adapter(self) -> Adapter:
        """The model's architecture adapter (headlens.arch), built on first use and kept while `model` is the
        same object."""
        if self._adapter is None or self._adapter.model is not self.model:
            self._adapter = adapter_for(self.model)
        return self._adapter

    def digest(self) -> str:
        """The one digest of this model's weights as they are in memory now (the key of headlens.cache): where
        they came from, the config, and every parameter's and buffer's name, shape, dtype and checksum
        (tensor_checksum), read wherever accelerate placed it. A weight edited after loading changes it."""
        source = self.source.sha256 if self.source is not None else str(self.path or self.name)
        digest = hashlib.sha256(f"{source}|{self.model.config.to_json_string()}".encode())
        with torch.no_grad():
            for prefix, module in self.model.named_modules():
                with onloaded(module):  # an offloaded module's weights are read where accelerate keeps them
                    own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
                    for name, tensor in own:
                        digest.update(f"{prefix}.{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
                        digest.update(tensor_checksum(tensor.detach()))
        return digest.hexdigest()

    @property
    def bos_token_id(self) -> int:
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return int(bos if bos is not None else self.model.config.bos_token_id)


def spec_of(model: torch.nn.Module) -> ModelSpec:
    """Shape facts read through the model's architecture adapter."""
    adapter = adapter_for(model)
    return ModelSpec(
        n_layers=adapter.n_layers,
        n_heads=adapter.n_heads,
        d_model=adapter.d_model,
        d_head=adapter.d_head,
        n_ctx=adapter.n_ctx,
        d_vocab=adapter.d_vocab,
        n_params=sum(p.numel() for p in model.parameters()),
        n_kv_heads=adapter.n_kv_heads,
        family=adapter.family,
    )


@lru_cache(maxsize=1)
def gpt2_tokenizer():
    """The real GPT-2 BPE tokenizer from package data: works offline, ids equal GPT-2's.

    transformers 5 builds it from an in-memory vocab and merge list; handing it the file
    paths silently yields an empty vocabulary.
    """
    from transformers import GPT2TokenizerFast

    folder = shipped_path("gpt2-tokenizer")
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    tok = GPT2TokenizerFast(
        vocab=vocab, merges=merges, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    if len(tok) != 50257:
        raise ModelLoadError(f"shipped GPT-2 tokenizer has {len(tok)} tokens, expected 50257: package data damaged")
    return tok


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' own progress bars ("Loading weights", "Writing model shards") and its
    warnings (the coloured LOAD REPORT table): the library never prints, and what a load reports
    is turned into one error line by load_model. Restores the previous settings on exit."""
    from transformers.utils import logging as hf_logging

    was_enabled, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if was_enabled:
            hf_logging.enable_progress_bar()


def _to_eager(model: PreTrainedModel) -> PreTrainedModel:
    model.config._attn_implementation = "eager"
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None:
            config._attn_implementation = "eager"
    return model


def build_model(config=None, seed: int = 0, tokenizer=None, name: str = "random") -> LoadedModel:
    """A causal LM with random weights from a config of a supported family (default: GPT-2
    small's shape), e.g. `GPT2Config(...)`, `LlamaConfig(...)`, `GPTNeoXConfig(...)`."""
    from transformers import AutoModelForCausalLM, GPT2Config

    # A private copy: the model keeps (and we edit) its config; callers may share theirs.
    config = copy.deepcopy(config) if config is not None else GPT2Config()
    check_supported(getattr(config, "model_type", None), "config")
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = _to_eager(AutoModelForCausalLM.from_config(config, attn_implementation="eager")).eval()
    tok = tokenizer if tokenizer is not None else gpt2_tokenizer()
    return LoadedModel(model=model, tokenizer=tok, spec=spec_of(model), name=name)


def save_model(loaded: LoadedModel, directory: str | os.PathLike) -> Path:
    """Write config, safetensors weights and tokenizer in Hugging Face format."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _quiet_transformers():
        loaded.model.save_pretrained(directory, safe_serialization=True)
    loaded.tokenizer.save_pretrained(directory)
    return directory


def boot_bridge(loaded: LoadedModel):
    """A TransformerLens `TransformerBridge` around a *separate copy* of `loaded.model`.

    The bridge wraps (and may modify) the model it is given, so it gets a deep copy. It is
    booted from a temporary local directory holding only config and tokenizer files (the
    weights come from the copy), so nothing is downloaded and no weights are rewritten.
    """
    import tempfile

    from transformer_lens import TransformerBridge
    from transformers import AutoTokenizer

    hf_copy = copy.deepcopy(loaded.model)
    param = next(loaded.model.parameters())
    with tempfile.TemporaryDirectory(prefix="headlens-bridge-") as tmp:
        loaded.model.config.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        # TransformerLens re-reads the tokenizer by name_or_path: it must be a local directory.
        tokenizer = AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)
        return TransformerBridge.boot_transformers(
            tmp, hf_model=hf_copy, tokenizer=tokenizer, device=param.device, dtype=param.dtype
        )


def resolve_model_path(name_or_path: str) -> Path:
    """Map a short name, a local directory or a hub id to a local Hugging Face directory."""
    if name_or_path in SHIPPED_MODELS:
        path = shipped_path(SHIPPED_MODELS[name_or_path])
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"the shipped model {name_or_path!r} is missing from {path}: reinstall headlens")
        return path
    candidate = Path(name_or_path).expanduser()
    if candidate.exists():
        if not candidate.is_dir():
            raise ModelLoadError(f"{candidate} is a file: pass the directory that holds config.json and weights")
        return candidate
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelLoadError(f"no such model directory: {name_or_path}")
    return resolve_hub(name_or_path)


def resolve_model(name_or_path: str) -> tuple[Path, ModelSource | None, str]:
    """(local Hugging Face directory, the GGUF it was dequantized from or None, display name)."""
    if name_or_path in SHIPPED_MODELS:
        return resolve_model_path(name_or_path), None, name_or_path
    from headlens.load import locate  # GGUF names (named models, ollama:, .gguf): optional for a shipped model

    gguf = locate.find_gguf(name_or_path)
    if gguf is not None:
        gguf_path, sha256, display = gguf
        folder, source = locate.gguf_folder(gguf_path, sha256)
        return folder, source, display
    path = resolve_model_path(name_or_path)
    local = Path(name_or_path).expanduser().exists()
    return path, None, (path.name if local else name_or_path)


TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")


# Special tokens a converted folder's tokenizer_config.json names, handed to PreTrainedTokenizerFast as they are.
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")


def converted_tokenizer(path: Path):
    """The tokenizer of a folder headlens converted from a GGUF, read straight from its tokenizer.json.

    AutoTokenizer re-derives the family's tokenizer class from that file (slower, mostly
    a second parse of its 262,144-entry vocabulary); the file already holds the whole pipeline
    (normalizer, BPE, BOS template), so the fast tokenizer built from it gives the same ids
    (tests/test_gguf_real.py compares the two on both named models)."""
    from transformers import PreTrainedTokenizerFast

    config = read_json(path / "tokenizer_config.json", "tokenizer config", ModelLoadError)
    config = config if isinstance(config, dict) else {}
    special = {key: config[key] for key in _SPECIAL_TOKEN_KEYS if isinstance(config.get(key), str)}
    return PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), **special)


def _vocab_rows(model: PreTrainedModel) -> int:
    """Rows of the input embedding: the token ids the model can read."""
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, torch.nn.Embedding), type(embedding)  # every supported family's wte/embed_tokens
    return embedding.num_embeddings


def _load_tokenizer(path: Path, d_vocab: int, converted: bool = False):
    """The folder's tokenizer; without tokenizer files, the shipped GPT-2 one when the model's vocabulary
    is GPT-2's size (a folder written for random GPT-2-shaped weights), else ModelLoadError naming the files.
    `converted`: a folder headlens wrote from a GGUF (converted_tokenizer)."""
    from transformers import AutoTokenizer

    if converted and all((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return converted_tokenizer(path)
    if any((path / f).is_file() for f in TOKENIZER_FILES):
        try:
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        except Exception as exc:
            raise ModelLoadError(f"tokenizer files in {path} cannot be read: {exc}") from None
    tokenizer = gpt2_tokenizer()
    if d_vocab != len(tokenizer):
        raise ModelLoadError(
            f"{path} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is there, and the "
            f"model's {d_vocab}-token vocabulary is not GPT-2's; copy the model's tokenizer files "
            "into the folder"
        )
    return tokenizer


def load_model(
    name_or_path: str,
    device: str | torch.device | None = "cpu",
    dtype: str | torch.dtype | None = torch.float32,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> LoadedModel:
    """Load a causal language model of a supported family for inspection.

    `name_or_path`: "tiny" (the model shipped with headlens), a local Hugging Face directory
    (config.json + model.safetensors + tokenizer files), a hub id such as "gpt2" resolved
    through the Hugging Face cache, or a GGUF: "smollm2" / "gemma3-270m" (after `headlens pull`),
    `ollama:NAME[:TAG]`, a `.gguf` file or a folder holding one (dequantized to float32 once and
    cached; `source` records the quantization). `device` (resolve_device; None: the GPU when present) and
    `dtype` (resolve_dtype). `device_map` ("auto", or a module -> device dict) places the layers
    with accelerate's big-model inference across GPUs, CPU and disk (`max_memory`: device ->
    bytes or "10GiB"; `offload_folder`: where disk-offloaded weights go); `device` is then
    ignored. Raises ModelLoadError with a one-line reason when weights are missing, corrupt, or
    of a family without an adapter (headlens.arch.SUPPORTED_TYPES).
    """
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(dtype)
    target = resolve_device(device) if device_map is None else None
    path, source, display_name = resolve_model(name_or_path)
    check_local_dir(path)
    placement = placement_kwargs(device_map, max_memory, offload_folder)
    try:
        with _quiet_transformers():
            loaded = AutoModelForCausalLM.from_pretrained(
                str(path),
                attn_implementation="eager",
                dtype=dtype,
                trust_remote_code=False,
                weights_only=True,  # a pytorch_model.bin is read by torch.load(weights_only=True) only
                output_loading_info=True,
                **placement,
            )
    except Exception as exc:  # transformers wraps I/O and format errors in many types
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "weights only load failed" in first_line.lower():
            first_line = (
                "the checkpoint holds objects other than tensors, and headlens only unpickles with "
                "torch.load(weights_only=True); convert it to model.safetensors"
            )
        raise ModelLoadError(f"cannot load weights from {path}: {first_line}") from None
    # output_loading_info: (model, {"missing_keys": ..., ...}), a pair transformers' stubs do not type
    model, info = cast("tuple[PreTrainedModel, dict]", loaded)
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would fill them with random values
        raise ModelLoadError(
            f"{path} lacks {len(missing)} weights of its model (e.g. {missing[0]}): incomplete checkpoint"
        )
    model = _to_eager(model).eval()
    if target is not None:
        # Module.to moves in place. PreTrainedModel.to is wrapped by functools.wraps, whose typeshed type
        # mypy cannot bind to an instance: the cast names the signature it copies (Module.to's).
        cast(torch.nn.Module, model).to(target)
    tokenizer = _load_tokenizer(path, _vocab_rows(model), converted=source is not None)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        spec=spec_of(model),
        name=name_or_path,
        path=path,
        display_name=display_name,
        source=source,
    )
