# cython: language_level=3
# Our common/ layer (common/include): llama.cpp's JSON-schema-to-grammar converter and its chat layer for tool
# calls, behind wrappers that turn their exceptions into return values.

from libcpp cimport bool as cbool
from libcpp.string cimport string

from pyllama_so._native.llama cimport llama_model


cdef extern from "pyllama-so-json-schema.h" nogil:
    cbool pyllama_so_json_schema_to_grammar(const string & schema_json, string & out) noexcept


cdef extern from "pyllama-so-chat-tools.h" nogil:
    cbool pyllama_so_chat_tools_apply(const llama_model * model, const string & template_src,
                                      const string & request_json, string & out) noexcept
    cbool pyllama_so_chat_tools_parse(const string & parser_json, const string & text, cbool is_partial,
                                      string & out) noexcept
