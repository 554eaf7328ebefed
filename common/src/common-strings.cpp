// The three string helpers declared in upstream's common/common.h that the JSON-schema converter calls.
// Upstream defines them in common/common.cpp, which also holds the rest of llama-common (logging, sampling,
// downloads, fitting) and cannot be linked without it; they are defined here, by their declarations.

#include "common.h"

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
