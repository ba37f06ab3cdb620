// Jinja values with Python semantics: str()/repr(), truthiness, equality, json.dumps.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "runtime/core/error.hpp"
#include "runtime/text/jinja.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text::jinja {

const Value* Object::find(std::string_view key) const {
    for (const auto& [k, v] : items)
        if (k == key) return &v;
    return nullptr;
}

void Object::set(std::string key, Value v) {
    for (auto& [k, old] : items) {
        if (k == key) {
            old = std::move(v);
            return;
        }
    }
    items.emplace_back(std::move(key), std::move(v));
}

Value Value::undefined(std::string hint) {
    Value v;
    if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
    return v;
}

Value Value::none() {
    Value v;
    v.kind_ = Kind::None;
    return v;
}

Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::Int), i_(v) {}
Value::Value(double v) : kind_(Kind::Float), f_(v) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(Array a) : kind_(Kind::Array), a_(std::make_shared<Array>(std::move(a))) {}
Value::Value(Object o) : kind_(Kind::Object), o_(std::make_shared<Object>(std::move(o))) {}
Value::Value(std::shared_ptr<Callable> c) : kind_(Kind::Callable), c_(std::move(c)) {}

// Nesting limit for converting, printing and serializing values (hostile inputs, cycles made
// through namespace attributes).
constexpr int kMaxValueDepth = 256;

template <typename J>
static Value value_from_json(const J& j, int depth = 0) {
    if (depth > kMaxValueDepth) scr::fail("template context nests deeper than {} levels", kMaxValueDepth);
    switch (j.type()) {
        case nlohmann::json::value_t::null: return Value::none();
        case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
        case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
        case nlohmann::json::value_t::number_unsigned: {
            const auto u = j.template get<uint64_t>();
            return u > static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<double>(u)) : Value(static_cast<int64_t>(u));
        }
        case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
        case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
        case nlohmann::json::value_t::array: {
            Array a;
            a.reserve(j.size());
            for (const auto& e : j) a.push_back(value_from_json(e, depth + 1));
            return Value(std::move(a));
        }
        case nlohmann::json::value_t::object: {
            Object o;
            o.items.reserve(j.size());
            for (auto it = j.begin(); it != j.end(); ++it) o.items.emplace_back(it.key(), value_from_json(it.value(), depth + 1));
            return Value(std::move(o));
        }
        default: return Value::none();
    }
}

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

namespace {
thread_local int repr_depth = 0;
struct ReprDepth {
    ReprDepth() {
        if (++repr_depth > kMaxValueDepth) {
            repr_depth = 0;
            scr::fail("value nests deeper than {} levels (a cycle?)", kMaxValueDepth);
        }
    }
    ~ReprDepth() { if (repr_depth > 0) --repr_depth; }
};
}  // namespace

const std::string& Value::undefined_hint() const {
    static const std::string empty;
    return (kind_ == Kind::Undefined && s_) ? *s_ : empty;
}

const void* Value::identity() const {
    switch (kind_) {
        case Kind::String: return s_.get();
        case Kind::Array: return a_.get();
        case Kind::Object: return o_.get();
        case Kind::Callable: return c_.get();
        default: return nullptr;
    }
}

bool Value::truthy() const {
    switch (kind_) {
        case Kind::Undefined:
        case Kind::None: return false;
        case Kind::Bool: return b_;
        case Kind::Int: return i_ != 0;
        case Kind::Float: return f_ != 0.0;
        case Kind::String: return !s_->empty();
        case Kind::Array: return !a_->empty();
        case Kind::Object: return !o_->items.empty();
        case Kind::Callable: return true;
    }
    return false;
}

std::string python_float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
    // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, res.ptr);
    const size_t e = sci.find('e');
    std::string mant = sci.substr(0, e);
    const int exp = std::stoi(sci.substr(e + 1));
    bool neg = false;
    if (mant[0] == '-') {
        neg = true;
        mant.erase(0, 1);
    }
    std::string digits;
    for (char c : mant)
        if (c != '.') digits.push_back(c);
    std::string out;
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            if (static_cast<int>(digits.size()) <= exp + 1) {
                out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
            } else {
                out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
            }
        } else {
            out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
        }
    } else {
        out = digits.substr(0, 1);
        if (digits.size() > 1) {
            out.push_back('.');
            out.append(digits, 1, std::string::npos);
        }
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        out += eb;
    }
    if (neg) out.insert(out.begin(), '-');
    return out;
}

static std::string repr_string(const std::string& s) {
    const bool has_single = s.find('\'') != std::string::npos;
    const bool has_double = s.find('"') != std::string::npos;
    const char quote = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, quote);
    for (unsigned char c : s) {
        if (c == static_cast<unsigned char>(quote) || c == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(c));
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        } else {
            out.push_back(static_cast<char>(c));
        }
    }
    out.push_back(quote);
    return out;
}

std::string Value::to_str() const {
    switch (kind_) {
        case Kind::Undefined: return "";
        case Kind::None: return "None";
        case Kind::Bool: return b_ ? "True" : "False";
        case Kind::Int: return std::to_string(i_);
        case Kind::Float: return python_float_repr(f_);
        case Kind::String: return *s_;
        default: return repr();
    }
}

std::string Value::repr() const {
    const ReprDepth guard;
    switch (kind_) {
        case Kind::String: return repr_string(*s_);
        case Kind::Array: {
            std::string out = "[";
            for (size_t k = 0; k < a_->size(); ++k) {
                if (k) out += ", ";
                out += (*a_)[k].repr();
            }
            return out + "]";
        }
        case Kind::Object: {
            std::string out = o_->is_namespace ? "<Namespace {" : "{";
            for (size_t k = 0; k < o_->items.size(); ++k) {
                if (k) out += ", ";
                out += repr_string(o_->items[k].first) + ": " + o_->items[k].second.repr();
            }
            return out + (o_->is_namespace ? "}>" : "}");
        }
        case Kind::Callable: return "<function " + c_->name + ">";
        default: return to_str();
    }
}

std::string Value::type_name() const {
    switch (kind_) {
        case Kind::Undefined: return "Undefined";
        case Kind::None: return "NoneType";
        case Kind::Bool: return "bool";
        case Kind::Int: return "int";
        case Kind::Float: return "float";
        case Kind::String: return "str";
        case Kind::Array: return "list";
        case Kind::Object: return o_->is_namespace ? "Namespace" : "dict";
        case Kind::Callable: return "function";
    }
    return "?";
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out.push_back('"');
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            ++i;
            switch (c) {
                case '"': out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                case '\b': out += "\\b"; break;
                case '\f': out += "\\f"; break;
                default:
                    if (c < 0x20) {
                        char b[8];
                        std::snprintf(b, sizeof b, "\\u%04x", c);
                        out += b;
                    } else {
                        out.push_back(static_cast<char>(c));
                    }
            }
            continue;
        }
        const size_t start = i;
        const char32_t cp = utf8::next(s, i);
        if (!ensure_ascii) {
            out.append(s, start, i - start);
            continue;
        }
        char b[16];
        if (cp >= 0x10000) {
            const char32_t v = cp - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
        } else {
            std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(cp));
        }
        out += b;
    }
    out.push_back('"');
}

void Value::dump_json(std::string& out, const JsonOptions& opt, int depth) const {
    if (depth > kMaxValueDepth) scr::fail("tojson: value nests deeper than {} levels (a cycle?)", kMaxValueDepth);
    auto newline = [&](int d) {
        if (opt.indent < 0) return;
        out.push_back('\n');
        out.append(static_cast<size_t>(opt.indent * d), ' ');
    };
    switch (kind_) {
        case Kind::None: out += "null"; return;
        case Kind::Bool: out += b_ ? "true" : "false"; return;
        case Kind::Int: out += std::to_string(i_); return;
        case Kind::Float:
            if (std::isnan(f_)) out += "NaN";
            else if (std::isinf(f_)) out += f_ > 0 ? "Infinity" : "-Infinity";
            else out += python_float_repr(f_);
            return;
        case Kind::String: json_string(out, *s_, opt.ensure_ascii); return;
        case Kind::Array: {
            if (a_->empty()) {
                out += "[]";
                return;
            }
            out.push_back('[');
            for (size_t k = 0; k < a_->size(); ++k) {
                if (k) out += opt.item_sep;
                newline(depth + 1);
                (*a_)[k].dump_json(out, opt, depth + 1);
            }
            newline(depth);
            out.push_back(']');
            return;
        }
        case Kind::Object: {
            if (o_->items.empty()) {
                out += "{}";
                return;
            }
            std::vector<const std::pair<std::string, Value>*> order;
            for (const auto& kv : o_->items) order.push_back(&kv);
            if (opt.sort_keys)
                std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
            out.push_back('{');
            for (size_t k = 0; k < order.size(); ++k) {
                if (k) out += opt.item_sep;
                newline(depth + 1);
                json_string(out, order[k]->first, opt.ensure_ascii);
                out += opt.key_sep;
                order[k]->second.dump_json(out, opt, depth + 1);
            }
            newline(depth);
            out.push_back('}');
            return;
        }
        case Kind::Undefined: scr::fail("tojson: Object of type Undefined is not JSON serializable");
        case Kind::Callable: scr::fail("tojson: Object of type function is not JSON serializable");
    }
}

std::string Value::to_json(const JsonOptions& opt) const {
    std::string out;
    dump_json(out, opt, 0);
    return out;
}

bool operator==(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind_ != b.kind_) return false;
    switch (a.kind_) {
        case Kind::Undefined:
        case Kind::None: return true;
        case Kind::String: return *a.s_ == *b.s_;
        case Kind::Array: return *a.a_ == *b.a_;
        case Kind::Object: {
            if (a.o_->items.size() != b.o_->items.size()) return false;
            for (const auto& [k, v] : a.o_->items) {
                const Value* w = b.o_->find(k);
                if (!w || !(v == *w)) return false;
            }
            return true;
        }
        case Kind::Callable: return a.c_ == b.c_;
        default: return false;
    }
}

}  // namespace scr::text::jinja
