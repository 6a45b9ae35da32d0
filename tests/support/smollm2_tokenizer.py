"""The default model's tokenizer as transformers converts it from the GGUF (the template and
detokenizer oracle), saved once in the pytest cache: the conversion takes ~7 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.models.default_model import default_model_path


def converted_tokenizer_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding transformers' conversion of the default GGUF's tokenizer, refreshed when
    the GGUF file or the transformers version changes."""
    import transformers

    gguf = default_model_path()
    cache = getattr(request.config, "cache", None)  # absent under `-p no:cacheprovider`
    folder = cache.mkdir("arbor-smollm2-tokenizer") if cache else tmp_path_factory.mktemp("smollm2")
    stamp = f"{gguf.stat().st_size}-{gguf.stat().st_mtime_ns}-{transformers.__version__}"
    if not (folder / "stamp").exists() or (folder / "stamp").read_text() != stamp:
        transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
        (folder / "stamp").write_text(stamp)
    return folder
