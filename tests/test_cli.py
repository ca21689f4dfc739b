"""CLI errors: one line on stderr, exit status 2, before any model is loaded."""

from __future__ import annotations

import pytest

from codespec.cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize(
    "setup, argv, message",
    [
        (None, ["generate", "missing.txt"], "no such file"),
        ("bin", ["generate", "p"], "looks binary"),
        ("latin1", ["generate", "p"], "not UTF-8"),
        ("empty", ["generate", "p"], "is empty"),
        ("ok", ["generate", "--index", "x.idx", "p"], "no such file"),
        (None, ["index", "stats", "p"], "no such file"),
        ("ok", ["index", "stats", "p"], "not a codespec index"),
        (None, ["index", "no/such/dir"], "not a directory"),
        (None, ["index", "export", "p", "--sglang", "c.jsonl"], "no such file"),
        ("ok", ["index", "export", "p", "--sglang", "c.jsonl"], "not a codespec index"),
        ("ok", ["index", "export", "p", "--sglang", "c.jsonl", "--max-tokens", "0"], "positive"),
        ("ok", ["generate", "--max-new-tokens", "0", "p"], "at least 1"),
        ("ok", ["generate", "--max-draft-tokens", "-1", "p"], "--max-draft-tokens -1: input should be greater than or equal to 0"),
        ("ok", ["generate", "--model", "/no/such/model", "p"], "no such directory"),
        (None, ["bench", "--workloads", "chat"], "unknown chat"),
        (None, ["bench", "verify", "--sets", "chat"], "unknown chat"),
        (None, ["bench", "verify", "--batches", "one"], "not a list of numbers"),
        (None, ["bench", "verify", "--repeat", "0"], "at least 1"),
        (None, ["lsp", "--server", "localhost:8000"], "give a URL"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, monkeypatch, capsys, setup, argv, message):
    monkeypatch.chdir(tmp_path)
    contents = {"bin": b"\x00\x01", "latin1": "caf\u00e9".encode("latin-1"), "empty": b"", "ok": b"def f():"}
    if setup:
        (tmp_path / "p").write_bytes(contents[setup])
    code, err = run(capsys, *argv)
    assert code == 2
    assert message in err and err.startswith("codespec: error:") and "\n" not in err


def test_help_lists_settings_with_their_env_names(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "--max-draft-tokens" in out and "CODESPEC_MAX_DRAFT_TOKENS" in out


@pytest.mark.parametrize("name", ["CODESPEC_FORWARD", "CODESPEC_LINEAR"])
def test_unknown_kernel_setting_is_one_clear_line(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p").write_text("def f():")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.setenv(name, "fastest")
    code, err = run(capsys, "generate", "--model", str(tmp_path / "model"), "p")
    assert code == 2 and err.count("\n") == 0 and err.startswith(f"codespec: error: {name}='fastest'"), err


def test_quantize_where_the_row_decoder_does_not_run_is_one_clear_line(monkeypatch):
    """--quantize int8 needs the C row decoder: elsewhere the load stops with why."""
    import torch

    from codespec.errors import ModelError
    from codespec.forward.select import _for_model
    from tests.tiny import tiny_model

    model = tiny_model("qwen2", vocab_size=16, dtype=torch.float32, hidden_size=256, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=192)
    with pytest.raises(ModelError, match="--quantize int8 runs on the C row decoder.*linear kernel 'torch'"):
        _for_model(model, "", "int8")
    with pytest.raises(ModelError, match="CODESPEC_FORWARD=transformers"):
        _for_model(model, "transformers", "int8")
