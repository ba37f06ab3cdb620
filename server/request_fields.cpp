#include "server/request_fields.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace scr::server {

using json = nlohmann::ordered_json;

namespace {

const char* type_name(const json& v) {
    switch (v.type()) {
        case json::value_t::string: return "a string";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned: return "an integer";
        case json::value_t::number_float: return "a number";
        case json::value_t::array: return "an array";
        case json::value_t::object: return "an object";
        default: return "null";
    }
}

}  // namespace

RequestFields::RequestFields(const json& object, std::string path) : object_(object), path_(std::move(path)) {}

const json* RequestFields::get(std::string_view key) {
    known_.emplace_back(key);
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<double> RequestFields::number(std::string_view key, double lo, double hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number())
        throw ApiError::invalid(name(key), fmt::format("`{}` must be a number, got {}", name(key), type_name(*v)),
                                "invalid_type");
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
        throw ApiError::invalid(name(key), fmt::format("`{}` must be between {} and {}, got {}", name(key), lo, hi, x));
    return x;
}

std::optional<int64_t> RequestFields::integer(std::string_view key, int64_t lo, int64_t hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    // 5 and 5.0 are both integers; 5.5, "5" and true are not.
    const bool integral = v->is_number_integer() || (v->is_number_float() && std::isfinite(v->get<double>()) &&
                                                     std::floor(v->get<double>()) == v->get<double>());
    if (!integral)
        throw ApiError::invalid(name(key), fmt::format("`{}` must be an integer, got {}", name(key), type_name(*v)),
                                "invalid_type");
    // Range-check in double first: a huge float must not be cast to int64 (undefined behaviour).
    const double as_double = v->get<double>();
    if (as_double < double(lo) || as_double > double(hi))
        throw ApiError::invalid(name(key), fmt::format("`{}` must be between {} and {}, got {}", name(key), lo, hi,
                                                       v->dump()));
    int64_t x;
    if (v->is_number_unsigned()) x = int64_t(std::min<uint64_t>(v->get<uint64_t>(), uint64_t(INT64_MAX)));
    else if (v->is_number_integer()) x = v->get<int64_t>();
    else x = int64_t(as_double);
    if (x < lo || x > hi)
        throw ApiError::invalid(name(key), fmt::format("`{}` must be between {} and {}, got {}", name(key), lo, hi, x));
    return x;
}

std::optional<bool> RequestFields::boolean(std::string_view key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
        throw ApiError::invalid(name(key), fmt::format("`{}` must be a boolean, got {}", name(key), type_name(*v)),
                                "invalid_type");
    return v->get<bool>();
}

std::optional<std::string> RequestFields::string(std::string_view key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string())
        throw ApiError::invalid(name(key), fmt::format("`{}` must be a string, got {}", name(key), type_name(*v)),
                                "invalid_type");
    return v->get<std::string>();
}

const json* RequestFields::object(std::string_view key) {
    const json* v = get(key);
    if (v && !v->is_object())
        throw ApiError::invalid(name(key), fmt::format("`{}` must be an object, got {}", name(key), type_name(*v)),
                                "invalid_type");
    return v;
}

const json* RequestFields::array(std::string_view key) {
    const json* v = get(key);
    if (v && !v->is_array())
        throw ApiError::invalid(name(key), fmt::format("`{}` must be an array, got {}", name(key), type_name(*v)),
                                "invalid_type");
    return v;
}

void RequestFields::ignore(std::initializer_list<std::string_view> keys) {
    for (auto k : keys) known_.emplace_back(k);
}

void RequestFields::reject(std::string_view key, std::string_view why) {
    if (get(key))
        throw ApiError::unsupported(name(key), fmt::format("`{}` is not supported by this server: {}", name(key), why));
}

void RequestFields::reject_unknown() const {
    for (const auto& [key, value] : object_.items()) {
        if (std::find(known_.begin(), known_.end(), key) == known_.end())
            throw ApiError(400, "invalid_request_error",
                           fmt::format("Unrecognized request argument supplied: {}", name(key)), name(key),
                           "unknown_parameter");
    }
}

}  // namespace scr::server
