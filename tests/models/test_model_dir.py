"""A damaged model directory is one clear line, before anything loads (a
garbage config.json and truncated weights gave tracebacks)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from codespec.errors import ModelError
from codespec.models.loading import check_model_dir, resolve_model_path
from codespec.settings import Settings


@pytest.fixture
def model_dir(tmp_path):
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    save_file({"w": np.ones((64, 64), dtype=np.float32), "b": np.zeros(64, dtype=np.float32)},
              str(tmp_path / "model.safetensors"))
    return tmp_path


def test_an_intact_directory_passes(model_dir):
    check_model_dir(model_dir, "--model x")
    assert resolve_model_path(str(model_dir), Settings())[1] == str(model_dir.resolve())


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "config.json").write_text('{"model_type": "qwen2", "hidden'), "config.json is not readable JSON"),
    (lambda d: (d / "config.json").write_text("[1, 2]"), "not a model configuration"),
    (lambda d: (d / "config.json").write_bytes(b"\xff\xfe\x00garbage"), "config.json is not readable JSON"),
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:5000]), "truncated"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x07"), "truncated"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 64), "broken header"),
    (lambda d: (d / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{not json" + b" " * 40),
     "broken header"),
])
def test_damage_is_one_clear_line(model_dir, damage, message):
    damage(model_dir)
    with pytest.raises(ModelError, match=message) as found:
        resolve_model_path(str(model_dir), Settings())
    assert "\n" not in str(found.value) and str(model_dir) in str(found.value)
