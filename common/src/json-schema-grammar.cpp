// JSON schema to GBNF: see pyllama-so-json-schema.h.

#include "pyllama-so-json-schema.h"

#include "json-schema-to-grammar.h"
#include "json.h"

#include <exception>

bool pyllama_so_json_schema_to_grammar(const std::string & schema_json, std::string & out) noexcept {
    try {
        // force_gbnf: the grammar goes to llama.cpp's GBNF sampler, whatever the converter was built with
        out = json_schema_to_grammar(common_json::parse(schema_json), /* force_gbnf = */ true);
        return true;
    } catch (const std::exception & e) {
        out = e.what();
    } catch (...) {
        out = "the JSON schema converter failed with an unknown exception";
    }
    return false;
}
