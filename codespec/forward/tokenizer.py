"""The model's tokenizer without transformers: its `tokenizer.json` in Hugging Face's
`tokenizers` (the Rust library transformers' fast tokenizers wrap, imported in ~30 ms
where transformers takes seconds) and its chat template in a jinja2 sandbox.

It answers the calls codespec makes of a tokenizer (prompts.py, indexing.py, the engine):
`tok(text or texts, add_special_tokens=False, split_special_tokens=...)["input_ids"]`,
`decode(ids, skip_special_tokens=True)`, `get_vocab()`, `apply_chat_template(...)`,
`convert_ids_to_tokens(id)` (logprobs), `backend_tokenizer`,
`eos_token_id`, `unk_token_id`, `chat_template`, with transformers' results for the
tokenizers it handles (byte-level BPE ones such as Qwen2's and Llama 3's; tested
against transformers on the default model's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from codespec.errors import ModelError


def _content(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


class DirectTokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._file = path / "tokenizer.json"
        try:
            self._plain = Tokenizer.from_file(str(self._file))
        except Exception as exc:  # the Rust library raises its own exception type
            raise ModelError(f"{self._file}: cannot read it ({exc})") from exc
        self._split_tokenizer: Any = None
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        # what defines the token ids: indexing.tokenizer_fingerprint memoizes by these files
        self.source_files = [self._file, *([config_file] if config_file.is_file() else [])]
        # the class transformers would load: index files fingerprint it (indexing.py)
        self.fingerprint_class = str(config.get("tokenizer_class") or "PreTrainedTokenizerFast")
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        template_file = path / "chat_template.jinja"
        self.chat_template = template_file.read_text() if template_file.is_file() else config.get("chat_template")
        self.special_tokens_map = {name: _content(config[name]) for name in ("bos_token", "eos_token", "unk_token",
                                                                              "pad_token") if _content(config.get(name))}
        self.eos_token = self.special_tokens_map.get("eos_token")
        self.eos_token_id = self._id(self.eos_token)
        self.unk_token_id = self._id(self.special_tokens_map.get("unk_token"))

    @property
    def _split(self) -> Any:
        """A second instance that encodes every added token's string as text (made on first
        use: reading tokenizer.json takes ~0.35 s, and prompts need only the first)."""
        if self._split_tokenizer is None:
            from codespec.prompts import text_tokenizer

            self._split_tokenizer = text_tokenizer(self._plain)
        return self._split_tokenizer

    @property
    def backend_tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer` underneath, as transformers' fast tokenizers name it."""
        return self._plain

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        """The vocabulary entry of `token_id` (byte-level BPE: one character per byte)."""
        return self._plain.id_to_token(int(token_id))

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._plain.token_to_id(token)

    def __call__(self, text: str | Sequence[str], *, add_special_tokens: bool = False,
                 split_special_tokens: bool = False) -> dict[str, Any]:
        tokenizer = self._split if split_special_tokens else self._plain
        # always the batch call: it lets go of the GIL while it works (`encode` holds it,
        # and a megabyte of text stalled the server's event loop for seconds)
        found = tokenizer.encode_batch([text] if isinstance(text, str) else list(text),
                                       add_special_tokens=add_special_tokens)
        ids = [e.ids for e in found]
        return {"input_ids": ids[0] if isinstance(text, str) else ids}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self._plain.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.clean_up_tokenization_spaces else text

    def get_vocab(self) -> dict[str, int]:
        return self._plain.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """id -> added token (`.content`, `.special`), as transformers' tokenizers give it:
        prompts.chat_ids cuts a rendered template at them."""
        return self._plain.get_added_tokens_decoder()

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False,
                            tokenize: bool = False, tools: list[dict[str, Any]] | None = None) -> Any:
        """The model's chat template rendered as transformers renders it: a sandboxed
        jinja2 environment with trim_blocks and lstrip_blocks, loop controls, `tojson`
        and `raise_exception`, and the special tokens as variables."""
        if self.chat_template is None:
            raise ModelError("this model has no chat template")
        text = _template(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                    tools=tools, documents=None, **self.special_tokens_map)
        return self(text)["input_ids"] if tokenize else text


def _template(source: str) -> Any:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def _clean_up(text: str) -> str:
    """transformers' `clean_up_tokenization` (spaces before punctuation and contractions)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text
