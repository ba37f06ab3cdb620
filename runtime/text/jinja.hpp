// A Jinja2 engine for chat templates: lexer, parser and tree-walking evaluator with Python
// semantics (what Hugging Face transformers renders with: jinja2's ImmutableSandboxedEnvironment,
// trim_blocks and lstrip_blocks on, loop controls, a tojson that keeps key order and non-ASCII).
// Anything the engine does not implement is an scr::Error naming it, at parse time when possible.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace scr::text::jinja {

class Value;
using Array = std::vector<Value>;

// Python dict: insertion-ordered.
struct Object {
    std::vector<std::pair<std::string, Value>> items;
    bool is_namespace = false;  // namespace(): the one object `set obj.attr = ...` may change
    const Value* find(std::string_view key) const;
    void set(std::string key, Value v);
};

struct CallArgs;
struct Callable {
    std::string name;
    std::function<Value(CallArgs&)> fn;
};

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, Array, Object, Callable };

class Value {
public:
    Value() = default;  // undefined
    static Value undefined(std::string hint = {});
    static Value none();
    Value(bool b);
    Value(int v) : Value(static_cast<int64_t>(v)) {}
    Value(int64_t v);
    Value(double v);
    Value(std::string s);
    Value(const char* s) : Value(std::string(s)) {}
    Value(Array a);
    Value(Object o);
    Value(std::shared_ptr<Callable> c);

    static Value from_json(const nlohmann::json& j);
    static Value from_json(const nlohmann::ordered_json& j);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::Undefined; }
    bool is_none() const { return kind_ == Kind::None; }
    bool is_bool() const { return kind_ == Kind::Bool; }
    bool is_int() const { return kind_ == Kind::Int; }
    bool is_float() const { return kind_ == Kind::Float; }
    bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
    bool is_string() const { return kind_ == Kind::String; }
    bool is_array() const { return kind_ == Kind::Array; }
    bool is_object() const { return kind_ == Kind::Object; }
    bool is_callable() const { return kind_ == Kind::Callable; }

    bool as_bool() const { return b_; }
    int64_t as_int() const { return kind_ == Kind::Bool ? (b_ ? 1 : 0) : i_; }
    double as_double() const { return kind_ == Kind::Float ? f_ : static_cast<double>(as_int()); }
    const std::string& str() const { return *s_; }
    const Array& array() const { return *a_; }
    Array& array_mut() { return *a_; }
    const Object& object() const { return *o_; }
    Object& object_mut() { return *o_; }
    const Callable& callable() const { return *c_; }
    const std::string& undefined_hint() const;
    // Identity for the `sameas` test.
    const void* identity() const;

    bool truthy() const;
    std::string to_str() const;   // Python str()
    std::string repr() const;     // Python repr()
    std::string type_name() const;  // Python type name, for error messages

    // json.dumps(ensure_ascii=False, ...) as transformers' tojson calls it.
    struct JsonOptions {
        int indent = -1;  // -1: no newlines
        std::string item_sep = ", ";
        std::string key_sep = ": ";
        bool sort_keys = false;
        bool ensure_ascii = false;
    };
    std::string to_json(const JsonOptions& opt) const;

    friend bool operator==(const Value& a, const Value& b);

private:
    void dump_json(std::string& out, const JsonOptions& opt, int depth) const;

    Kind kind_ = Kind::Undefined;
    bool b_ = false;
    int64_t i_ = 0;
    double f_ = 0;
    std::shared_ptr<const std::string> s_;  // string, or an undefined's name hint
    std::shared_ptr<Array> a_;
    std::shared_ptr<Object> o_;
    std::shared_ptr<Callable> c_;
};

struct CallArgs {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> keyword;
    const Value* get_kw(std::string_view name) const {
        for (const auto& [k, v] : keyword)
            if (k == name) return &v;
        return nullptr;
    }
};

// Python float repr (shortest round-trip, "1.0", "1e-05").
std::string python_float_repr(double d);

struct Node;

class Template {
public:
    // Parses `source`; throws scr::Error "<name>:<line>: ..." on syntax errors and unsupported
    // statements, filters or tests.
    explicit Template(std::string source, std::string name = "template");
    ~Template();
    Template(Template&&) noexcept;
    Template& operator=(Template&&) noexcept;

    // `context` must be an object; its keys become template variables. `globals` adds functions
    // (raise_exception, strftime_now, range, namespace, dict are always there).
    std::string render(const Value& context) const;

private:
    std::string name_;
    std::unique_ptr<Node> root_;
};

}  // namespace scr::text::jinja
