// The helpers declared in upstream's common/common.h that the JSON-schema converter and the chat layer call.
// Upstream defines them in common/common.cpp, which also holds the rest of llama-common (logging, sampling,
// downloads, fitting) and cannot be linked without it; they are defined here, by their declarations.

#include "common.h"
#include "llama.h"

#include <string>
#include <vector>

std::string string_join(const std::vector<std::string> & values, const std::string & separator) {
    std::string out;
    for (size_t i = 0; i < values.size(); i++) {
        if (i > 0) {
            out += separator;
        }
        out += values[i];
    }
    return out;
}

// every part, empty ones included: "a,,b" gives "a", "", "b"
std::vector<std::string> string_split(const std::string & str, const std::string & delimiter) {
    std::vector<std::string> parts;
    if (delimiter.empty()) {
        parts.push_back(str);
        return parts;
    }
    size_t start = 0;
    for (size_t pos = str.find(delimiter); pos != std::string::npos; pos = str.find(delimiter, start)) {
        parts.push_back(str.substr(start, pos - start));
        start = pos + delimiter.size();
    }
    parts.push_back(str.substr(start));
    return parts;
}

std::string string_repeat(const std::string & str, size_t n) {
    std::string out;
    out.reserve(str.size() * n);
    for (size_t i = 0; i < n; i++) {
        out += str;
    }
    return out;
}

void string_replace_all(std::string & s, const std::string & search, const std::string & replace) {
    if (search.empty()) {
        return;
    }
    std::string out;
    size_t start = 0;
    for (size_t pos = s.find(search); pos != std::string::npos; pos = s.find(search, start)) {
        out.append(s, start, pos - start);
        out += replace;
        start = pos + search.size();
    }
    out.append(s, start, std::string::npos);
    s = std::move(out);
}

// the chat layer's log lines go to stderr without colours
bool tty_can_use_colors() {
    return false;
}

std::vector<llama_token> common_tokenize(const struct llama_vocab * vocab, const std::string & text, bool add_special,
                                         bool parse_special) {
    std::vector<llama_token> out(text.size() + 2 * add_special);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special,
                               parse_special);
    if (n < 0) {  // -n: the count it needs
        out.resize(-n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special,
                           parse_special);
    }
    out.resize(n < 0 ? 0 : n);
    return out;
}

std::string common_token_to_piece(const struct llama_vocab * vocab, llama_token token, bool special) {
    std::string piece(16, '\0');
    int32_t n = llama_token_to_piece(vocab, token, &piece[0], (int32_t) piece.size(), 0, special);
    if (n < 0) {  // -n: the size it needs
        piece.resize(-n);
        n = llama_token_to_piece(vocab, token, &piece[0], (int32_t) piece.size(), 0, special);
    }
    piece.resize(n < 0 ? 0 : n);
    return piece;
}
