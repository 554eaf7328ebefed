#pragma once

#include <string>

struct llama_model;

// Tool calls through llama.cpp's chat layer (common/chat.cpp of the pinned tree: what llama-server runs with
// --jinja): the prompt of a chat with tools in the model's own format, the grammar that keeps a tool call
// well formed, and the parse of the generated text into content and tool calls. Both calls take and give
// JSON text and cannot throw: a failure returns false with its message in out.

// request_json: {"messages": [...], "tools": [...], "tool_choice": "auto" | "required" | "none",
// "parallel_tool_calls": bool, "add_generation_prompt": bool, "chat_template_kwargs": {...}} in OpenAI's shapes.
// template_src: the chat template's text, or empty for the model's own. out: {"prompt", "format", "grammar",
// "grammar_lazy", "trigger_patterns", "trigger_tokens", "grammar_prefill", "preserved_tokens", "additional_stops",
// "parser"}, where "parser" is what pyllama_so_chat_tools_parse takes and "grammar_prefill" the text the grammar
// accepts before the first generated token (empty for none).
bool pyllama_so_chat_tools_apply(const llama_model * model, const std::string & template_src,
                                 const std::string & request_json, std::string & out) noexcept;

// parser_json: the "parser" of an apply. out: the message in OpenAI's shape ({"role", "content",
// "tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}). is_partial: text is a prefix of
// the generation (streaming), parsed as far as it is certain.
bool pyllama_so_chat_tools_parse(const std::string & parser_json, const std::string & text, bool is_partial,
                                 std::string & out) noexcept;
