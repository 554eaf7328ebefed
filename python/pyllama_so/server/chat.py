"""Chat messages to a prompt, through llama.cpp's own chat templates (llama_chat_apply_template).

The template is --chat-template when given (a built-in name such as "chatml" or "llama3", or a model's
template text), else the model's own (tokenizer.chat_template), else DEFAULT_TEMPLATE. llama.cpp
recognizes a model's Jinja text by its markers and formats it with its built-in code (no Jinja engine);
a model template it does not recognize falls back to the default with a warning. The synthetic models
have no template, so they get the default.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyllama_so import _llama

log = logging.getLogger("pyllama_so.server")

DEFAULT_TEMPLATE = "chatml"  # <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n

_PROBE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


@dataclass(frozen=True)
class ChatTemplate:
    template: str  # a built-in name or a template text llama.cpp recognizes
    source: str  # where it came from, for the start-up log and /v1/models

    def format(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt for messages ({"role", "content"}), ending with the start of the assistant's turn.
        ValueError when llama.cpp cannot format them."""
        return _llama.chat_apply_template(self.template, messages, add_assistant=True)


def resolve(model: _llama.Model, override: str | None = None) -> ChatTemplate:
    """The template for model: override (ValueError if llama.cpp does not know it), else the model's,
    else DEFAULT_TEMPLATE."""
    if override:
        _llama.chat_apply_template(override, _PROBE)
        return ChatTemplate(override, "--chat-template")
    own = model.chat_template()
    if own is None:
        return ChatTemplate(DEFAULT_TEMPLATE, f"default ({DEFAULT_TEMPLATE}: the model has no chat template)")
    try:
        _llama.chat_apply_template(own, _PROBE)
    except ValueError:
        log.warning("llama.cpp does not recognize the model's chat template; using %s", DEFAULT_TEMPLATE)
        return ChatTemplate(DEFAULT_TEMPLATE, f"default ({DEFAULT_TEMPLATE}: llama.cpp does not know the model's)")
    return ChatTemplate(own, "the model's")
