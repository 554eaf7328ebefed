# Tool calls: llama.cpp's chat layer (common/chat.cpp of the pinned tree, the one llama-server runs with
# --jinja), compiled into our pyllama-so-chat-tools library behind a wrapper that turns its exceptions into
# messages. Included by _llama.pyx; pyllama_so.tool_calls builds on it.


def chat_tools_apply(Model model, dict request, str template=""):
    """The prompt of a chat with tools as llama-server makes it: request has OpenAI's messages, tools,
    tool_choice ("auto", "required", "none"), parallel_tool_calls, add_generation_prompt, chat_template_kwargs;
    template: a chat template's text ("" for the model's own). Returns a dict: prompt, format (the name of
    the format llama.cpp detected), grammar (GBNF, "" for none), grammar_lazy, trigger_patterns,
    trigger_tokens, grammar_prefill (token ids the grammar accepts first), preserved_tokens, additional_stops
    and parser (what chat_tools_parse takes). ValueError with the chat layer's message when it refuses."""
    model._check_open()
    try:
        creq = _json.dumps(request, allow_nan=False).encode()
        ctmpl = template.encode()
    except (TypeError, ValueError) as e:
        raise ValueError(f"the chat request is not JSON data: {e}") from None
    cdef string sreq = creq
    cdef string stmpl = ctmpl
    cdef string out
    cdef cbool ok
    with nogil:
        ok = pyllama_so_chat_tools_apply(model.ptr, stmpl, sreq, out)
    text = (<bytes> out).decode("utf-8", "replace")
    if not ok:
        raise ValueError(text)
    return _json.loads(text)


def chat_tools_parse(dict parser, str text, bint partial=False):
    """The message of generated text, as llama-server parses it: {"role", "content", "tool_calls": [{"type":
    "function", "function": {"name", "arguments"}}]} (tool_calls absent without any). parser: the "parser"
    of chat_tools_apply; partial: text is a prefix of the generation, parsed as far as it is certain.
    ValueError with the parser's message when the text does not parse."""
    cdef string sparser = _json.dumps(parser).encode()
    cdef string stext = text.encode("utf-8", "surrogatepass")
    cdef string out
    cdef cbool ok
    with nogil:
        ok = pyllama_so_chat_tools_parse(sparser, stext, partial, out)
    res = (<bytes> out).decode("utf-8", "replace")
    if not ok:
        raise ValueError(res)
    return _json.loads(res)
