# Grammars: llama.cpp's GBNF parser (behind llama_sampler_init_grammar) and its JSON-schema-to-grammar
# converter (common/json-schema-to-grammar.cpp of the pinned tree, compiled into our
# pyllama-so-json-schema library with a wrapper that turns its exceptions into messages). Included by
# _llama.pyx before _sampler.pxi, whose Sampler builds its grammar here.

import json as _json


cdef llama_sampler * _grammar_sampler(Model model, grammar, str root) except NULL:
    """llama.cpp's grammar sampler for GBNF text; a ValueError with the parser's message if it does not parse.
    grammar may also be a dict, a tool call's grammar (chat_tools_apply): {"grammar": GBNF text, "lazy": whether
    it waits for a trigger, "trigger_patterns": regular expressions, "trigger_tokens": token ids, "prefill":
    token ids it accepts first}, as llama-server's common sampler builds it."""
    spec = grammar if isinstance(grammar, dict) else {"grammar": grammar}
    text = spec.get("grammar")
    if not isinstance(text, str):
        raise ValueError(f"grammar must be GBNF text, not {type(text).__name__}")
    try:
        btext, broot = text.encode(), root.encode()
        bpatterns = [str(p).encode() for p in spec.get("trigger_patterns") or ()]
    except UnicodeEncodeError as e:
        raise ValueError(f"grammar is not valid Unicode text: {e}") from None
    if b"\0" in btext:
        raise ValueError("grammar contains a NUL character")
    tokens = [int(t) for t in spec.get("trigger_tokens") or ()]
    cdef bint lazy = bool(spec.get("lazy"))
    cdef const char * ctext = btext
    cdef const char * croot = broot
    cdef size_t i, n_pat = len(bpatterns), n_tok = len(tokens)
    cdef const char ** cpat = <const char **> malloc(max(n_pat, 1) * sizeof(char *))
    cdef llama_token * ctok = <llama_token *> malloc(max(n_tok, 1) * sizeof(llama_token))
    cdef llama_sampler * smpl
    try:
        if cpat == NULL or ctok == NULL:
            raise MemoryError()
        for i in range(n_pat):
            cpat[i] = <const char *> (<bytes> bpatterns[i])
        for i in range(n_tok):
            ctok[i] = tokens[i]
        _take_errors()
        with nogil:
            if lazy:
                smpl = llama_sampler_init_grammar_lazy_patterns(model.vocab, ctext, croot, cpat, n_pat, ctok, n_tok)
            else:
                smpl = llama_sampler_init_grammar(model.vocab, ctext, croot)
    finally:
        free(cpat)
        free(ctok)
    if smpl == NULL:
        lines = _take_errors()  # the parser's reason, then "failed to parse grammar" (patches/0009-*)
        raise ValueError("invalid grammar" + (": " + "; ".join(lines) if lines else ""))
    try:
        for tok in spec.get("prefill") or ():
            llama_sampler_accept_checked(smpl, <llama_token> int(tok))
    except Exception as e:
        llama_sampler_free(smpl)
        raise ValueError(f"the grammar does not accept the generation prompt: {e}") from None
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
