"""Request bodies (pydantic, validated at the edge) and OpenAI-style error bodies.

Values are taken as the JSON types they are meant to be (strict: `"2"` or `true` is no
token count) and numbers are finite. Options that would change the answer and are not
served (`best_of` above 1, `echo`, non-zero penalties) are refused with a 400 that names
them, not ignored. Unknown fields are ignored, as OpenAI and llama.cpp servers do, so
clients that send options that change nothing here (user, samplers, ...) keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from codespec.errors import RequestError
from codespec.verify.logprobs import MAX_TOP  # alternatives per token (OpenAI: 20 for chat, 5 for completions)

Stop = str | list[str] | None
# torch's generators take a signed 64-bit seed; OpenAI's `seed` is an integer
Seed = Annotated[int, Field(ge=-(2**63), lt=2**63, description="A signed 64-bit integer.")]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


def _not_served(name: str, served: object) -> object:
    """A validator that refuses any value of `name` but the one served."""
    def check(value: object) -> object:
        if value is not None and value != served:
            raise ValueError(f"{name} {value!r} is not served (only {served!r})")
        return value

    return field_validator(name)(lambda cls, value: check(value))


class _Penalties(_Request):
    """OpenAI's penalties: accepted at 0, which changes nothing; refused otherwise."""

    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    _presence = _not_served("presence_penalty", 0)
    _frequency = _not_served("frequency_penalty", 0)


class _Stops(_Request):
    """`stop`: a string or a list of up to 16 non-empty strings (OpenAI allows 4)."""

    stop: list[str] = Field(default_factory=list)

    @field_validator("stop", mode="before")
    @classmethod
    def _as_list(cls, value: Stop) -> list[str]:
        if value is None:
            return []
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or len(stops) > 16 or any(not isinstance(s, str) or not s for s in stops):
            raise ValueError("stop takes a string or up to 16 non-empty strings")
        return stops


class _CompletionLogprobs(_Request):
    """`logprobs: k` (legacy completions): each token's logprob and the k most likely."""

    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP)

    @property
    def alternatives(self) -> int | None:
        return self.logprobs


class _ChatLogprobs(_Request):
    """`logprobs: true` and `top_logprobs: k` (chat)."""

    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> _ChatLogprobs:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class _TextPart(_Request):
    type: Literal["text"]
    text: StrictStr


class Prediction(_Request):
    """OpenAI's Predicted Outputs: the output the client expects (a file it is having
    rewritten). It drafts; it never changes the answer."""

    type: Literal["content"]
    content: StrictStr | list[_TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class CompletionRequest(_Stops, _CompletionLogprobs, _Penalties):
    model: str | None = None
    prompt: str | list[str] | list[int] = Field(
        description="The prompt: a string, a list of exactly one string (n=1), or token ids (as OpenAI "
                    "allows; `codespec serve --upstream` and other engines' clients send the model's own tokens).")
    suffix: str | None = Field(None, description="Text after the insertion point: makes a FIM request.")
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = None
    stream: StrictBool = False
    n: int = Field(1, ge=1, le=1, description="Only n=1 is served.")
    best_of: int | None = None
    echo: bool = False
    prediction: Prediction | None = None
    _best_of = _not_served("best_of", 1)
    _echo = _not_served("echo", False)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
            if min(value) < 0:
                raise ValueError("token ids are non-negative")
            return value
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("give exactly one prompt (n=1)")
        return value

    @property
    def prompt_ids(self) -> list[int] | None:
        """The prompt's token ids when it was sent as ids, else None."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], int):
            return list(self.prompt)  # type: ignore[arg-type]
        return None

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else str(self.prompt[0])


FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="OpenAI's function name rule.")]


class _CalledFunction(_Request):
    name: StrictStr
    arguments: StrictStr | dict[str, Any] = "{}"


class ToolCall(_Request):
    """A tool call in an assistant message an agent sends back."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: _CalledFunction


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = ""
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: StrictStr | None = None  # a tool message's answer to that call
    name: StrictStr | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")

    def for_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class _Function(_Request):
    name: FunctionName
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments (checked: structured/tools.py)
    strict: StrictBool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: _Function


class _Named(_Request):
    name: StrictStr


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: _Named


class _JsonSchema(_Request):
    name: FunctionName
    description: StrictStr | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Request):
    """`text`, `json_object` (any JSON object) or `json_schema` (one that follows it)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema goes with type json_schema, and only with it")
        return self

    @property
    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer follows (None: free text)."""
        if self.type == "json_object":
            return {"type": "object"}
        return self.json_schema.schema_ if self.json_schema is not None else None


class ChatCompletionRequest(_Stops, _ChatLogprobs, _Penalties):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = None
    stream: StrictBool = False
    n: int = Field(1, ge=1, le=1)
    prediction: Prediction | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    response_format: ResponseFormat | None = None

    @property
    def limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256


class _RecentEdit(_Request):
    """Lines `start_line`.. of `path` read `before` and now read `after`."""

    path: StrictStr
    start_line: int = Field(ge=0)
    before: StrictStr = ""
    after: StrictStr = ""


class _Position(_Request):
    line: int = Field(ge=0)
    character: int = Field(ge=0, description="Unicode code points into the line.")


class NextEditRequest(_Request):
    """codespec's next-edit request: the file, the cursor and the recent edits; the
    answer is the edits the model predicts next (nextedit/)."""

    path: str = Field("untitled", min_length=1, max_length=4096)
    text: StrictStr
    cursor: int | None = Field(None, ge=0, description="An offset into `text`, in code points.")
    position: _Position | None = None
    recent_edits: list[_RecentEdit] = Field(default_factory=list, max_length=32)
    layout: Literal["sweep", "zeta", "instruct"] | None = None

    @model_validator(mode="after")
    def _one_cursor(self) -> NextEditRequest:
        if (self.cursor is None) == (self.position is None):
            raise ValueError("give the cursor as `cursor` (an offset) or as `position` (line and character)")
        return self

    def offset(self) -> int:
        """The cursor as an offset into `text` (a RequestError where it lies outside)."""
        if self.cursor is not None:
            offset = self.cursor
        else:
            assert self.position is not None
            lines = self.text.split("\n")
            if self.position.line >= len(lines) or self.position.character > len(lines[self.position.line]):
                raise RequestError(f"position {self.position.line}:{self.position.character} is outside the text "
                                   f"({len(lines)} lines)")
            offset = sum(len(line) + 1 for line in lines[: self.position.line]) + self.position.character
        if offset > len(self.text):
            raise RequestError(f"cursor {offset} is outside the text ({len(self.text)} characters)")
        return offset


class _SweepChunk(_Request):
    file_path: StrictStr
    content: StrictStr
    start_line: int = 0
    end_line: int = 0


class SweepNextEditRequest(_Request):
    """Sweep's local next-edit server's request (the `sweep-autocomplete` package, which
    Sweep's VS Code and JetBrains extensions call in local mode)."""

    file_path: StrictStr
    file_contents: StrictStr
    original_file_contents: StrictStr | None = None
    recent_changes: StrictStr = ""  # unified-diff hunks under `File: PATH` lines
    cursor_position: int = Field(ge=0, description="UTF-16 code units into file_contents, as the editors count.")
    file_chunks: list[_SweepChunk] = Field(default_factory=list, max_length=64)
    retrieval_chunks: list[_SweepChunk] = Field(default_factory=list, max_length=64)
    multiple_suggestions: StrictBool = False

    def offset(self) -> int:
        """The cursor in code points (past the end: the end)."""
        units = self.file_contents.encode("utf-16-le")[: 2 * self.cursor_position]
        return len(units.decode("utf-16-le", errors="ignore"))


class ExtraChunk(_Request):
    """llama.cpp's `input_extra` item: its `text` is required, its `filename` optional."""

    filename: StrictStr = ""
    text: StrictStr


class InfillRequest(_Stops):
    """llama.cpp's /infill, as llama.vim and llama.vscode send it."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""  # the already-typed text after the FIM middle token
    n_predict: int = Field(128, ge=-1)
    t_max_predict_ms: int | None = Field(None, ge=0)
    cache_prompt: StrictBool = True
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = None
    stream: StrictBool = False
    response_fields: list[str] | None = None  # llama.cpp's: only these (nested ones as "timings/prompt_n")
    n_indent: int = Field(0, ge=0)  # after the first line, a line indented less ends the completion
    # codespec's: the prompt's order (prompts.FIM_LAYOUTS); None: the server's `infill_layout`
    fim_layout: Literal["psm", "spm"] | None = None
    # codespec's: start a long input_prefix at its first anchor line (prompts.anchored_prefix)
    # so that a client's sliding line window keeps the cached prompt; false: as given
    # (codespec lsp's own windows are on a grid already)
    anchor_prefix: StrictBool = True


class PrefillRequest(InfillRequest):
    """codespec's: the prompt of an /infill request likely to come soon (the language
    server's idle time), to prefill while no request runs; `forget` drops `key`'s."""

    key: str = Field(min_length=1, max_length=4096)
    forget: StrictBool = False


class AcceptanceRequest(_Request):
    accepted: StrictBool


class DocumentRequest(_Request):
    key: str = Field(min_length=1, max_length=1024, description="Replaces a document with the same key.")
    text: str


class WorkspaceRequest(_Request):
    root: str = Field(min_length=1, max_length=4096, description="An absolute path of a local folder.")


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
