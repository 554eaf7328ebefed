"""The server's chat template (pyllama_so.chat_template renders it): --chat-template or --chat-template-file
when given, else the model's own tokenizer.chat_template (Jinja), else llama.cpp's built-in chatml.

Every template is compiled at start-up, so a broken one stops the server with its error instead of
failing each request; one that fails to render a request's messages is a 400 for that request (render,
with_tools: the prompt of a chat request, for /v1/chat/completions and /apply-template).
"""

from __future__ import annotations

import logging
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from pyllama_so import _llama
from pyllama_so.chat_template import ChatTemplate, from_spec, jinja_for_model, model_template
from pyllama_so.server.errors import ApiError
from pyllama_so.server.schemas import ChatTemplateRequest, GenerationRequest
from pyllama_so.tool_calls import ToolChat, ToolChoiceError, tool_chat

log = logging.getLogger("pyllama_so.server")

__all__ = ["ChatTemplate", "render", "resolve", "with_tools"]


def resolve(model: _llama.Model, template: str | None = None, template_file: str | Path | None = None) -> ChatTemplate:
    """The template for model: template (a built-in name, "chat_template.NAME" or a Jinja text), else the
    Jinja text of template_file, else the model's own, else chatml. ValueError (or OSError for an unreadable
    file) when it cannot be used; ImportError without Jinja2."""
    if template is not None and template_file is not None:
        raise ValueError("give --chat-template or --chat-template-file, not both")
    if template is not None:
        return from_spec(model, template, name="--chat-template")
    if template_file is not None:
        text = Path(template_file).read_text(encoding="utf-8")
        return jinja_for_model(model, text, name=f"the chat template of --chat-template-file {template_file}")
    return model_template(model)


async def render(chat: ChatTemplate, body: ChatTemplateRequest) -> str:
    """The chat prompt of a request; 400 naming the template when it fails to render the messages."""
    try:
        return await run_in_threadpool(body.render, chat)
    except ValueError as e:
        raise ApiError(400, str(e), param="messages") from None


async def with_tools(model: _llama.Model, chat: ChatTemplate, body: ChatTemplateRequest) -> ToolChat:
    """The prompt, grammar and parser of a chat with tools (llama.cpp's chat layer, as llama-server's
    --jinja): a 400 for a template that is not Jinja, a grammar of the request's own beside them, or
    messages and tools the chat layer refuses. A request that generates gets its grammar checked too."""
    template = getattr(chat, "text", None)
    if template is None:
        raise ApiError(400, f"tools need a Jinja chat template; the server's is {chat.name}", param="tools")
    generates = isinstance(body, GenerationRequest)
    if isinstance(body, GenerationRequest) and body.grammar_text() is not None:
        raise ApiError(400, "a grammar, json_schema or response_format cannot go with tools", param="tools")

    def prepare() -> ToolChat:
        tc = tool_chat(model, template, [m.variables() for m in body.messages], body.tools or [], body.tool_choice,
                       parallel_tool_calls=body.parallel_tool_calls, add_generation_prompt=body.add_generation_prompt,
                       template_kwargs=body.chat_template_kwargs, template_name=chat.name)
        if tc.warning:
            log.warning("%s", tc.warning)
        if generates and tc.grammar is not None:
            _llama.check_grammar(model, tc.grammar)  # before it is queued: the engine builds it with the slot's chain
        return tc
    try:
        return await run_in_threadpool(prepare)
    except ToolChoiceError as e:
        raise ApiError(400, str(e), param="tool_choice") from None
    except ValueError as e:
        raise ApiError(400, str(e), param="tools") from None
