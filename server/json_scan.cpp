#include "server/json_scan.hpp"

#include <algorithm>

namespace scr::server {

namespace {

// Walks `text`, calling on_depth(depth, index) after every bracket; stops when it returns true.
template <typename OnDepth>
void scan_brackets(std::string_view text, OnDepth&& on_depth) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') in_string = true;
        else if (c == '{' || c == '[') {
            if (on_depth(++depth, i)) return;
        } else if (c == '}' || c == ']') {
            if (on_depth(--depth, i)) return;
        }
    }
}

}  // namespace

int json_nesting_depth(std::string_view text) {
    int deepest = 0;
    scan_brackets(text, [&](int depth, size_t) {
        deepest = std::max(deepest, depth);
        return false;
    });
    return deepest;
}

size_t json_value_extent(std::string_view text) {
    if (text.empty() || (text[0] != '{' && text[0] != '[')) return 0;
    size_t extent = 0;
    scan_brackets(text, [&](int depth, size_t i) {
        if (depth > 0) return false;
        extent = i + 1;
        return true;
    });
    return extent;
}

}  // namespace scr::server
