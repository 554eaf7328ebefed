#pragma once

#include <string>

// llama.cpp's JSON-schema-to-grammar converter (common/json-schema-to-grammar.cpp of the pinned tree, the
// one llama-server uses for "json_schema" and "response_format") behind a call that cannot throw: the
// converter reports a bad schema with an exception, which must not unwind into the bindings.
//
// schema_json: the schema as JSON text. Returns true with the GBNF grammar in out, or false with the
// message of the JSON parser or of the converter in out.
bool pyllama_so_json_schema_to_grammar(const std::string & schema_json, std::string & out) noexcept;
