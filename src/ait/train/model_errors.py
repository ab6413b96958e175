"""The error of base-model resolution, in a leaf of its own.

`ait.train.models` resolves names and `ait.train.gguf` converts GGUF files for it; both raise
ModelResolutionError. It lives here, importing nothing of ait, so that gguf need not import
models (which imports gguf to convert): the two would otherwise form an import cycle. Callers
keep catching it as `ait.train.models.ModelResolutionError`, the resolution API they call.
"""

from __future__ import annotations


class ModelResolutionError(ValueError):
    """A base model name that cannot be turned into local weights."""
