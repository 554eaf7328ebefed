// Tool calls through llama.cpp's chat layer: see pyllama-so-chat-tools.h.

#include "pyllama-so-chat-tools.h"

#include "chat.h"
#include "common.h"
#include "json.h"
#include "llama.h"

#include <exception>
#include <string>
#include <vector>

using json = common_json;

// a trigger word as a regular expression that matches it literally (ECMAScript, as llama-grammar's std::regex)
static std::string regex_literal(const std::string & word) {
    static const std::string special = "\\^$.|?*+()[]{}-/";
    std::string out;
    for (char c : word) {
        if (special.find(c) != std::string::npos) {
            out += '\\';
        }
        out += c;
    }
    return out;
}

// llama-server's conversion of a chat's grammar triggers into a lazy grammar's patterns and tokens
// (common_sampler_init in common/sampling.cpp of the pinned tree)
static void add_triggers(const std::vector<common_grammar_trigger> & triggers, json & out) {
    json patterns = json::array();
    json tokens   = json::array();
    for (const auto & t : triggers) {
        switch (t.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:
                patterns.push_back(regex_literal(t.value));
                break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
                patterns.push_back(t.value);
                break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL:
                {
                    std::string anchored = "^$";
                    if (!t.value.empty()) {
                        anchored = (t.value.front() != '^' ? "^" : "") + t.value + (t.value.back() != '$' ? "$" : "");
                    }
                    patterns.push_back(anchored);
                    break;
                }
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:
                tokens.push_back((int) t.token);
                break;
        }
    }
    out["trigger_patterns"] = patterns;
    out["trigger_tokens"]   = tokens;
}

// the tokens of the generation prompt that a tool-call grammar accepts before the first generated token, less a
// space some tokenizers put before a first special token (common_sampler_init does the same)
static json prefill_tokens(const llama_model * model, const std::string & text) {
    json out = json::array();
    if (text.empty() || model == nullptr) {
        return out;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> toks = common_tokenize(vocab, text, false, true);
    for (size_t i = 0; i < toks.size(); i++) {
        const std::string piece = common_token_to_piece(vocab, toks[i], true);
        if (i == 0 && !piece.empty() && std::isspace((unsigned char) piece[0]) && !std::isspace((unsigned char) text[0])) {
            continue;
        }
        out.push_back((int) toks[i]);
    }
    return out;
}

// runs f, which sets out; an exception becomes its message in out and false: none may unwind into the bindings
template <typename F>
static bool guarded(std::string & out, const char * what, F && f) noexcept {
    try {
        f();
        return true;
    } catch (const std::exception & e) {
        out = e.what();
    } catch (...) {
        out = std::string(what) + " failed with an unknown exception";
    }
    return false;
}

bool pyllama_so_chat_tools_apply(const llama_model * model, const std::string & template_src,
                                 const std::string & request_json, std::string & out) noexcept {
    return guarded(out, "llama.cpp's chat layer", [&] {
        const json req = json::parse(request_json);
        auto tmpls = common_chat_templates_init(model, template_src);
        auto caps  = common_chat_templates_get_caps(tmpls.get());

        common_chat_templates_inputs in;
        in.use_jinja             = true;
        in.messages              = common_chat_msgs_parse_oaicompat(req.at("messages"));
        in.tools                 = common_chat_tools_parse_oaicompat(req.value("tools", json()));
        in.tool_choice           = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
        in.parallel_tool_calls   = req.value("parallel_tool_calls", (bool) caps["supports_parallel_tool_calls"]);
        in.add_generation_prompt = req.value("add_generation_prompt", true);
        in.reasoning_format      = COMMON_REASONING_FORMAT_NONE;  // a model's thinking stays in the content
        if (req.contains("chat_template_kwargs")) {
            for (const auto & [key, val] : req.at("chat_template_kwargs").items()) {
                in.chat_template_kwargs[key] = val.dump();
            }
        }

        const common_chat_params p = common_chat_templates_apply(tmpls.get(), in);

        json res = json::object();
        res["prompt"]       = p.prompt;
        res["format"]       = std::string(common_chat_format_name(p.format));
        res["grammar"]      = p.grammar;
        res["grammar_lazy"] = p.grammar_lazy;
        add_triggers(p.grammar_triggers, res);
        // llama-server prefills a tool-call grammar that applies from the first token (not a lazy one)
        res["grammar_prefill"]  = !p.grammar.empty() && !p.grammar_lazy ? prefill_tokens(model, p.generation_prompt)
                                                                          : json::array();
        res["preserved_tokens"] = p.preserved_tokens;
        res["additional_stops"] = p.additional_stops;
        json parser = json::object();
        parser["format"]            = (int) p.format;
        parser["generation_prompt"] = p.generation_prompt;
        parser["parser"]            = p.parser;
        res["parser"] = parser;
        out = res.dump();
    });
}

bool pyllama_so_chat_tools_parse(const std::string & parser_json, const std::string & text, bool is_partial,
                                 std::string & out) noexcept {
    return guarded(out, "llama.cpp's chat parser", [&] {
        const json pj = json::parse(parser_json);
        common_chat_parser_params pp;
        pp.format            = (common_chat_format) pj.at("format").get<int>();
        pp.generation_prompt = pj.value("generation_prompt", std::string());
        pp.reasoning_format  = COMMON_REASONING_FORMAT_NONE;
        pp.parse_tool_calls  = true;
        const std::string parser = pj.value("parser", std::string());
        if (!parser.empty()) {
            pp.parser.load(parser);
        }
        out = common_chat_parse(text, is_partial, pp).to_json_oaicompat().dump();
    });
}
