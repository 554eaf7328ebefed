# Grammars: llama.cpp's GBNF parser (behind llama_sampler_init_grammar) and its JSON-schema-to-grammar
# converter (common/json-schema-to-grammar.cpp of the pinned tree, compiled into our
# pyllama-so-json-schema library with a wrapper that turns its exceptions into messages). Included by
# _llama.pyx before _sampler.pxi, whose Sampler builds its grammar here.

import json as _json


cdef llama_sampler * _grammar_sampler(Model model, grammar, str root) except NULL:
    """llama.cpp's grammar sampler for GBNF text; a ValueError with the parser's message if it does not parse."""
    if not isinstance(grammar, str):
        raise ValueError(f"grammar must be GBNF text, not {type(grammar).__name__}")
    try:
        btext, broot = grammar.encode(), root.encode()
    except UnicodeEncodeError as e:
        raise ValueError(f"grammar is not valid Unicode text: {e}") from None
    if b"\0" in btext:
        raise ValueError("grammar contains a NUL character")
    cdef const char * ctext = btext
    cdef const char * croot = broot
    cdef llama_sampler * smpl
    _take_errors()
    with nogil:
        smpl = llama_sampler_init_grammar(model.vocab, ctext, croot)
    if smpl == NULL:
        lines = _take_errors()  # the parser's reason, then "failed to parse grammar" (patches/0009-*)
        raise ValueError("invalid grammar" + (": " + "; ".join(lines) if lines else ""))
    return smpl


def check_grammar(Model model, grammar, str root="root"):
    """Parse GBNF text for model's vocabulary as a Sampler would, and keep nothing: a ValueError with the
    parser's message if it does not parse (the server checks a request's grammar before queueing it)."""
    model._check_open()
    llama_sampler_free(_grammar_sampler(model, grammar, root))


def json_schema_to_grammar(schema):
    """The GBNF grammar of a JSON schema (a dict, or its JSON text), by llama.cpp's converter: the grammar
    llama-server builds for "json_schema". A schema it cannot convert, or text that is not JSON, is a
    ValueError with the converter's (or JSON parser's) message."""
    if isinstance(schema, str):
        text = schema
    elif isinstance(schema, dict):
        try:
            text = _json.dumps(schema, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the JSON schema is not JSON data: {e}") from None
    else:
        raise ValueError(f"a JSON schema must be a dict or JSON text, not {type(schema).__name__}")
    try:
        src = text.encode()
    except UnicodeEncodeError as e:
        raise ValueError(f"the JSON schema is not valid Unicode text: {e}") from None
    cdef string csrc = src
    cdef string out
    cdef cbool ok
    with nogil:
        ok = pyllama_so_json_schema_to_grammar(csrc, out)
    msg = (<bytes> out).decode("utf-8", "replace")
    if not ok:
        raise ValueError(msg)
    return msg
