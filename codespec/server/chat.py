"""POST /v1/chat/completions: OpenAI's chat, with tools, response_format and prediction.

Tools go through the model's chat template (prompts.chat_ids) and come back as
`tool_calls` (structured/tools.py); `response_format` json_object and json_schema, and
`tool_choice` required, a named function or a `strict` function, are grammars
(structured/grammar.py) that mask every row of a verify pass (verify/grammar.py): the
output is the one constrained plain decoding gives. `prediction` drafts
(index/prediction.py) and usage reports how much of it the answer kept.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from codespec import prompts
from codespec.engine.run import Generation, GenerationConfig
from codespec.errors import RequestError
from codespec.server.logprobs import chat_logprobs
from codespec.server.responses import (AnyBackend, Envelope, alternatives, backend, check_model, predicted, stream,
                                       streaming, unless_client_leaves)
from codespec.server.schemas import ChatCompletionRequest
from codespec.server.upstream_backend import UpstreamBackend
from codespec.structured.grammar import Grammar, grammar_tokens
from codespec.structured.tools import (CLOSE, MALFORMED, OPEN, Call, CallStream, Toolbox, repeated_call_end,
                                       template_messages)

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request, b: AnyBackend = Depends(backend)) -> Any:
    check_model(b, req.model)
    b.check_prompt_size(*(m.text() for m in req.messages))
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else req.tool_choice
    tools = Toolbox([t.model_dump() for t in req.tools or []], choice, req.parallel_tool_calls)
    schema = req.response_format.answer_schema if req.response_format is not None else None
    if schema is not None and tools.calling:
        raise RequestError("response_format: a JSON answer and tool calls in one request are not served; send "
                           'tool_choice "none", or leave response_format out and read the calls\' arguments')
    messages = template_messages([m.for_template() for m in req.messages])
    ids = await run_in_threadpool(prompts.chat_ids, b.tokenizer, messages, tools.shown)
    prediction = await predicted(b, req.prediction)
    b.check_request(ids, req.limit, prediction)
    grammar = await run_in_threadpool(_grammar, b, tools, schema)
    config = GenerationConfig(max_new_tokens=req.limit, stop=tuple(req.stop), temperature=req.temperature,
                              top_p=req.top_p, seed=req.seed, logprobs=alternatives(b, req.alternatives),
                              prediction=prediction, grammar=grammar,
                              end_at=repeated_call_end if tools.calling else None)
    envelope = Envelope(f"chatcmpl-{uuid.uuid4().hex}", b.name, prediction)

    def shown(logprobs: Any) -> dict[str, Any]:
        return {"logprobs": chat_logprobs(logprobs, b.token_text)} if config.logprobs is not None else {}

    calls = CallStream() if tools.calling else None

    def chunk(text: str, done: Generation | None, logprobs: Any) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": text if calls is None else calls.push(text)}
        read = _Read.of(tools, done) if done is not None and calls is not None else None
        if read is not None:
            if read.calls:
                delta["tool_calls"] = [call.to_json(i) for i, call in enumerate(read.calls)]
            else:
                delta["content"] += calls.unsent()
        out = envelope("chat.completion.chunk", {"delta": delta, **shown(logprobs)}, done, read and read.finish)
        return _with_problem(out, read)

    if req.stream:
        return streaming(stream(b, ids, config, chunk))
    g = await unless_client_leaves(request, b.complete(ids, config))
    if not isinstance(g, Generation):
        return g
    read = _Read.of(tools, g) if tools.calling else None
    message: dict[str, Any] = {"role": "assistant", "content": g.text if read is None else read.content}
    if read is not None and read.calls:
        message["tool_calls"] = [call.to_json() for call in read.calls]
    out = envelope("chat.completion", {"message": message, **shown(g.logprobs)}, g, read and read.finish)
    return _with_problem(out, read)


@dataclass(frozen=True)
class _Read:
    """A tool-calling answer read once: its content, its calls, its finish_reason (None:
    the generation's) and what was wrong with a call that could not be read."""

    content: str | None
    calls: list[Call]
    finish: str | None
    problem: str | None

    @classmethod
    def of(cls, tools: Toolbox, g: Generation) -> _Read:
        content, calls, problem = tools.read(g.text)
        # without calls: MALFORMED where a call could not be read (one cut by max_tokens says "length")
        finish = "tool_calls" if calls else (MALFORMED if problem is not None and g.finish_reason != "length"
                                             else None)
        return cls(content, calls, finish, problem)


def _grammar(b: AnyBackend, tools: Toolbox, schema: dict[str, Any] | None) -> Grammar | None:
    """The request's grammar (None: free text), compiled and checked: a 400 names the field."""
    needs = schema is not None or tools.grammar_needed
    if not needs:
        return None
    if isinstance(b, UpstreamBackend):
        raise RequestError("response_format and tool_choice grammars are not served through --upstream; "
                           "ask the engine behind it directly")
    tokens = grammar_tokens(b.tokenizer, b.engine.forward.config.vocab_size, b.engine.eos_token_ids)
    if schema is not None:
        return Grammar.json_schema(tokens, schema)
    return tools.grammar(tokens, prompts.special_id(b.tokenizer, OPEN), prompts.special_id(b.tokenizer, CLOSE))


def _with_problem(out: dict[str, Any], read: _Read | None) -> dict[str, Any]:
    """What was wrong with a malformed call, beside the stats (`codespec.tool_call_error`)."""
    if read is not None and read.problem is not None:
        out["codespec"]["tool_call_error"] = read.problem
    return out
