"""The server's chat template (pyllama_so.chat_template renders it): --chat-template or --chat-template-file
when given, else the model's own tokenizer.chat_template (Jinja), else llama.cpp's built-in chatml.

Every template is compiled at start-up, so a broken one stops the server with its error instead of
failing each request; one that fails to render a request's messages is a 400 for that request.
"""

from __future__ import annotations

from pathlib import Path

from pyllama_so import _llama
from pyllama_so.chat_template import ChatTemplate, from_spec, jinja_for_model, model_template

__all__ = ["ChatTemplate", "resolve"]


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
