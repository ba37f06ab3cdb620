#include "server/api_error.hpp"

namespace scr::server {

using nlohmann::json;

json openai_error_body(const ApiError& e) {
    json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
    if (!e.param.empty()) err["param"] = e.param;
    if (!e.code.empty()) err["code"] = e.code;
    return {{"error", std::move(err)}};
}

json anthropic_error_body(const ApiError& e) {
    // Anthropic's error types are keyed by status (docs.anthropic.com/en/api/errors).
    const char* type = "api_error";
    switch (e.status) {
        case 400: type = "invalid_request_error"; break;
        case 401: type = "authentication_error"; break;
        case 403: type = "permission_error"; break;
        case 404: type = "not_found_error"; break;
        case 413: type = "request_too_large"; break;
        case 429: type = "rate_limit_error"; break;
        case 503: type = "overloaded_error"; break;
        default: if (e.status >= 400 && e.status < 500) type = "invalid_request_error"; break;
    }
    return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

std::string to_wire(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace scr::server
