// Two byte scanners over JSON text that run before (or instead of) a full parse: nlohmann's parser
// and destructor recurse per nesting level, so untrusted text is depth-checked first.
#pragma once

#include <cstddef>
#include <string_view>

namespace scr::server {

// Deepest nesting of [] and {} in `text` (brackets inside strings do not count).
int json_nesting_depth(std::string_view text);

// Byte length of the object or array that starts at text[0], or 0 when it does not close within
// `text` (or text[0] is not '{' or '['). Tracks strings and escapes; does not validate.
size_t json_value_extent(std::string_view text);

}  // namespace scr::server
