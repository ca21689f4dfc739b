from __future__ import annotations

import pytest

from codespec.errors import ModelError
from codespec.models.loading import resolve_model_path
from codespec.settings import Settings


def test_wrong_model_paths_give_one_actionable_line(tmp_path):
    s = Settings(cache_dir=tmp_path)
    with pytest.raises(ModelError, match="no such directory"):
        resolve_model_path(str(tmp_path / "nope"), s)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model_path(str(tmp_path / "empty"), s)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelError, match="not a directory"):
        resolve_model_path(str(tmp_path / "file"), s)


def test_local_directory_and_hub_id(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path / "m"), Settings())[1] == str((tmp_path / "m").resolve())
    assert resolve_model_path("Qwen/Qwen2.5-Coder-0.5B", Settings()) == ("Qwen/Qwen2.5-Coder-0.5B",) * 2


def test_tiny_model_saved_and_loaded_through_load(tmp_path):
    """A local HF directory goes through the same loader as the default model."""
    from codespec.forward.select import load
    from tests.tiny import tiny_model

    tiny_model("llama", vocab_size=32).save_pretrained(tmp_path / "tiny")
    with pytest.raises(ModelError, match="cannot load model"):
        load(Settings(model=str(tmp_path / "tiny"), dtype="float64"), progress=False)  # no tokenizer saved
