// The Jinja evaluator: Python semantics for operators, str/list/dict methods, jinja2's filters and
// tests, loop variables, macros and call blocks. Unknown names resolve to Undefined as in jinja2's
// default Undefined: it prints as "", is falsy and iterates as empty, but reading an attribute or
// item of it is an error.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>
#include <unordered_set>

#include "runtime/core/error.hpp"
#include "runtime/text/jinja_ast.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text::jinja {

namespace {

// An error without a location; the evaluator adds "<template>:<line>:".
struct EvalError {
    std::string message;
};
[[noreturn]] void eval_fail(std::string msg) { throw EvalError{std::move(msg)}; }

// ---- string helpers (Python str semantics on code points) ----

std::vector<char32_t> code_points(const std::string& s) {
    std::vector<char32_t> cps;
    cps.reserve(s.size());
    for (size_t i = 0; i < s.size();) cps.push_back(utf8::next(s, i));
    return cps;
}

std::string from_code_points(const std::vector<char32_t>& cps, size_t a, size_t b) {
    std::string out;
    for (size_t k = a; k < b; ++k) utf8::append(out, cps[k]);
    return out;
}

bool py_isspace(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
bool is_cased(char32_t c) {
    const auto cat = category(c);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string map_case(const std::string& s, char32_t (*f)(char32_t)) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) utf8::append(out, f(utf8::next(s, i)));
    return out;
}

// str.strip / lstrip / rstrip with an optional character set.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
    const auto cps = code_points(s);
    std::vector<char32_t> set;
    const bool custom = !chars.is_none() && !chars.is_undefined();
    if (custom) {
        if (!chars.is_string()) eval_fail("strip arg must be None or str");
        set = code_points(chars.str());
    }
    auto strip_it = [&](char32_t c) {
        return custom ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
    };
    size_t a = 0, b = cps.size();
    if (left)
        while (a < b && strip_it(cps[a])) ++a;
    if (right)
        while (b > a && strip_it(cps[b - 1])) --b;
    return from_code_points(cps, a, b);
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
    std::vector<std::string> out;
    if (!sep || sep->is_none()) {
        // Runs of whitespace; leading/trailing ignored.
        const auto cps = code_points(s);
        size_t i = 0;
        while (i < cps.size()) {
            while (i < cps.size() && py_isspace(cps[i])) ++i;
            if (i >= cps.size()) break;
            if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
                size_t end = cps.size();
                while (end > i && py_isspace(cps[end - 1])) --end;
                out.push_back(from_code_points(cps, i, end));
                return out;
            }
            size_t j = i;
            while (j < cps.size() && !py_isspace(cps[j])) ++j;
            out.push_back(from_code_points(cps, i, j));
            i = j;
        }
        return out;
    }
    if (!sep->is_string()) eval_fail("split: separator must be a string");
    const std::string& d = sep->str();
    if (d.empty()) eval_fail("ValueError: empty separator");
    size_t pos = 0;
    while (true) {
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
        const size_t k = s.find(d, pos);
        if (k == std::string::npos) break;
        out.push_back(s.substr(pos, k - pos));
        pos = k + d.size();
    }
    out.push_back(s.substr(pos));
    return out;
}

std::vector<std::string> py_splitlines(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
            out.push_back(s.substr(start, i - start));
            if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
            start = i + 1;
        }
    }
    if (start < s.size()) out.push_back(s.substr(start));
    return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    std::string out;
    if (from.empty()) {
        // Python inserts `to` between every code point (and at both ends).
        const auto cps = code_points(s);
        int64_t n = 0;
        for (size_t k = 0; k <= cps.size(); ++k) {
            if (count < 0 || n < count) {
                out += to;
                ++n;
            }
            if (k < cps.size()) utf8::append(out, cps[k]);
        }
        return out;
    }
    size_t pos = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
        const size_t k = s.find(from, pos);
        if (k == std::string::npos) break;
        out.append(s, pos, k - pos);
        out += to;
        pos = k + from.size();
        ++n;
    }
    out.append(s, pos, std::string::npos);
    return out;
}

std::string py_capitalize(const std::string& s) {
    const auto cps = code_points(s);
    std::string out;
    for (size_t k = 0; k < cps.size(); ++k) utf8::append(out, k == 0 ? to_upper(cps[k]) : to_lower(cps[k]));
    return out;
}

std::string py_title(const std::string& s) {
    std::string out;
    bool prev_cased = false;
    for (size_t i = 0; i < s.size();) {
        const char32_t c = utf8::next(s, i);
        const bool cased = is_cased(c);
        utf8::append(out, cased ? (prev_cased ? to_lower(c) : to_upper(c)) : c);
        prev_cased = cased;
    }
    return out;
}

// jinja2's |title: capitalize each piece between runs of [-\s({[<].
std::string jinja_title(const std::string& s) {
    const auto cps = code_points(s);
    std::string out;
    bool word_start = true;
    for (char32_t c : cps) {
        const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
        if (sep) {
            utf8::append(out, c);
            word_start = true;
        } else {
            utf8::append(out, word_start ? to_upper(c) : to_lower(c));
            word_start = false;
        }
    }
    return out;
}

// Python slice indices for a sequence of length n.
std::vector<size_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
    auto opt = [](const Value& v) -> std::optional<int64_t> {
        if (v.is_undefined() || v.is_none()) return std::nullopt;
        if (!v.is_int() && !v.is_bool()) eval_fail("slice indices must be integers or None");
        return v.as_int();
    };
    const int64_t step = opt(step_v).value_or(1);
    if (step == 0) eval_fail("slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
        if (!v) return dflt;
        int64_t x = *v;
        if (x < 0) x += n;
        if (step > 0) return std::clamp<int64_t>(x, 0, n);
        return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(opt(start_v), step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(opt(stop_v), step > 0 ? n : -1);
    std::vector<size_t> idx;
    if (step > 0)
        for (int64_t k = start; k < stop; k += step) idx.push_back(static_cast<size_t>(k));
    else
        for (int64_t k = start; k > stop; k += step) idx.push_back(static_cast<size_t>(k));
    return idx;
}

int64_t length_of(const Value& v) {
    switch (v.kind()) {
        case Kind::String: return static_cast<int64_t>(utf8::count(v.str()));
        case Kind::Array: return static_cast<int64_t>(v.array().size());
        case Kind::Object: return static_cast<int64_t>(v.object().items.size());
        case Kind::Undefined: return 0;
        default: eval_fail("object of type '" + v.type_name() + "' has no len()");
    }
}

// Python iteration: list items, dict keys, string characters; Undefined is empty.
Array iterate(const Value& v) {
    switch (v.kind()) {
        case Kind::Array: return v.array();
        case Kind::Object: {
            Array keys;
            for (const auto& kv : v.object().items) keys.emplace_back(kv.first);
            return keys;
        }
        case Kind::String: {
            Array chars;
            const std::string& s = v.str();
            for (size_t i = 0; i < s.size();) {
                const size_t a = i;
                i += utf8::seq_len(static_cast<unsigned char>(s[i]));
                chars.emplace_back(s.substr(a, i - a));
            }
            return chars;
        }
        case Kind::Undefined: return {};
        default: eval_fail("'" + v.type_name() + "' object is not iterable");
    }
}

// Python ordering (<) for sort/min/max and comparison operators.
bool less_than(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
        return a.as_int() < b.as_int();
    }
    if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order == code point order
    if (a.is_array() && b.is_array()) {
        const auto& x = a.array();
        const auto& y = b.array();
        for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
            if (!(x[k] == y[k])) return less_than(x[k], y[k]);
        }
        return x.size() < y.size();
    }
    eval_fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
    switch (container.kind()) {
        case Kind::String:
            if (!item.is_string()) eval_fail("'in <string>' requires string as left operand, not " + item.type_name());
            return container.str().find(item.str()) != std::string::npos;
        case Kind::Array:
            for (const auto& e : container.array())
                if (e == item) return true;
            return false;
        case Kind::Object: return item.is_string() && container.object().find(item.str()) != nullptr;
        case Kind::Undefined: return false;
        default: eval_fail("argument of type '" + container.type_name() + "' is not iterable");
    }
}

// Python printf-style formatting for `str % args` and |format: %s %r %d %i %f %%.
std::string percent_format(const std::string& fmt, const Value& args) {
    Array list = args.is_array() ? args.array() : Array{args};
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out.push_back(fmt[i]);
            continue;
        }
        if (++i >= fmt.size()) eval_fail("incomplete format");
        const char c = fmt[i];
        if (c == '%') {
            out.push_back('%');
            continue;
        }
        if (next >= list.size()) eval_fail("not enough arguments for format string");
        const Value& v = list[next++];
        if (c == 's') out += v.to_str();
        else if (c == 'r') out += v.repr();
        else if ((c == 'd' || c == 'i') && v.is_number()) out += std::to_string(static_cast<int64_t>(v.as_double()));
        else if (c == 'f' && v.is_number()) out += fmt::format("{:.6f}", v.as_double());
        else eval_fail(std::string("unsupported format specifier '%") + c + "'");
    }
    if (next < list.size()) eval_fail("not all arguments converted during string formatting");
    return out;
}

const std::unordered_set<std::string>& filter_names() {
    static const std::unordered_set<std::string> names = {
        "abs",     "attr",  "capitalize", "center", "count",    "d",       "default", "dictsort", "e",
        "escape",  "first", "float",      "format", "indent",   "int",     "items",   "join",     "last",
        "length",  "list",  "lower",      "map",    "max",      "min",     "reject",  "rejectattr",
        "replace", "reverse", "round",    "safe",   "select",   "selectattr", "sort", "string",   "sum",
        "title",   "tojson", "trim",      "unique", "upper",    "wordcount"};
    return names;
}

const std::unordered_set<std::string>& test_names() {
    static const std::unordered_set<std::string> names = {
        "boolean", "callable", "defined", "divisibleby", "eq",     "equalto", "even",    "false", "float",
        "ge",      "gt",       "greaterthan", "in",      "integer", "iterable", "le",     "lower", "lt",
        "lessthan", "mapping", "ne",      "none",        "number", "odd",     "sameas",  "sequence", "string",
        "true",    "undefined", "upper"};
    return names;
}

// Returns a copy: callers pass temporaries as the fallback.
Value arg_at(const CallArgs& a, size_t index, const char* kw, const Value& fallback) {
    if (index < a.positional.size()) return a.positional[index];
    if (kw) {
        if (const Value* v = a.get_kw(kw)) return *v;
    }
    return fallback;
}

Value make_function(std::string name, std::function<Value(CallArgs&)> fn) {
    return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

struct Scope {
    std::unordered_map<std::string, Value> vars;
    Scope* parent = nullptr;
    const Value* find(const std::string& name) const {
        for (const Scope* s = this; s; s = s->parent) {
            auto it = s->vars.find(name);
            if (it != s->vars.end()) return &it->second;
        }
        return nullptr;
    }
};

enum class Flow { Normal, Break, Continue };

class Renderer {
public:
    Renderer(const std::string& name, Scope& globals) : name_(name), globals_(globals) {}

    Flow exec(const Body& body, Scope& scope, std::string& out) {
        for (const auto& n : body) {
            const Flow f = exec_node(*n, scope, out);
            if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
    }

private:
    [[noreturn]] void fail(int line, const std::string& msg) const { scr::fail("{}:{}: {}", name_, line, msg); }

    Flow exec_node(const Node& n, Scope& scope, std::string& out) {
        try {
            return exec_node_inner(n, scope, out);
        } catch (const EvalError& e) {
            fail(n.line, e.message);
        }
    }

    Flow exec_node_inner(const Node& n, Scope& scope, std::string& out) {
        switch (n.type) {
            case Node::Type::Root: return exec(n.body, scope, out);
            case Node::Type::Text: out += n.text; return Flow::Normal;
            case Node::Type::Output: out += eval(*n.expr, scope).to_str(); return Flow::Normal;
            case Node::Type::If:
                for (const auto& [cond, body] : n.branches)
                    if (eval(*cond, scope).truthy()) return exec(body, scope, out);
                return exec(n.else_body, scope, out);
            case Node::Type::For: return exec_for(n, scope, out);
            case Node::Type::Set: {
                Value v = eval(*n.expr, scope);
                if (!n.attr.empty()) {
                    const Value* target = scope.find(n.targets[0]);
                    if (!target || !target->is_object() || !target->object().is_namespace)
                        eval_fail("cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
                    const_cast<Value*>(target)->object_mut().set(n.attr, std::move(v));
                } else {
                    assign(scope, n.targets, std::move(v));
                }
                return Flow::Normal;
            }
            case Node::Type::SetBlock: {
                std::string text;
                exec(n.body, scope, text);
                Value v(std::move(text));
                if (n.expr) v = apply_filter_chain(*n.expr, std::move(v), scope);
                scope.vars[n.targets[0]] = std::move(v);
                return Flow::Normal;
            }
            case Node::Type::Macro: scope.vars[n.text] = make_macro(n, nullptr); return Flow::Normal;
            case Node::Type::CallBlock: {
                const Expr& call = *n.expr;
                Value callee = eval(*call.args[0], scope);
                if (!callee.is_callable()) eval_fail("{% call %} target is not callable");
                CallArgs args = eval_args(call, 1, scope);
                args.keyword.emplace_back("caller", make_macro(n, &scope));
                out += callee.callable().fn(args).to_str();
                return Flow::Normal;
            }
            case Node::Type::FilterBlock: {
                std::string text;
                exec(n.body, scope, text);
                out += apply_filter_chain(*n.expr, Value(std::move(text)), scope).to_str();
                return Flow::Normal;
            }
            case Node::Type::With: {
                Scope inner;
                inner.parent = &scope;
                for (size_t k = 0; k < n.targets.size(); ++k) inner.vars[n.targets[k]] = eval(*n.defaults[k], scope);
                return exec(n.body, inner, out);
            }
            case Node::Type::Break: return Flow::Break;
            case Node::Type::Continue: return Flow::Continue;
        }
        return Flow::Normal;
    }

    Value apply_filter_chain(const Expr& chain, Value body, Scope& scope) {
        Scope inner;
        inner.parent = &scope;
        inner.vars["__body__"] = std::move(body);
        return eval(chain, inner);
    }

    void assign(Scope& scope, const std::vector<std::string>& targets, Value v) {
        if (targets.size() == 1) {
            scope.vars[targets[0]] = std::move(v);
            return;
        }
        Array items = iterate(v);
        if (items.size() != targets.size())
            eval_fail(fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
        for (size_t k = 0; k < targets.size(); ++k) scope.vars[targets[k]] = std::move(items[k]);
    }

    Flow exec_for(const Node& n, Scope& scope, std::string& out) {
        const Value seq = eval(*n.expr, scope);
        if (seq.is_none()) eval_fail("'NoneType' object is not iterable");
        Array items = iterate(seq);
        Scope loop_scope;
        loop_scope.parent = &scope;
        if (n.cond) {
            // `for x in xs if cond`: filter first, so loop.length and friends see the kept items.
            Array kept;
            for (auto& item : items) {
                assign(loop_scope, n.targets, item);
                if (eval(*n.cond, loop_scope).truthy()) kept.push_back(std::move(item));
            }
            items.swap(kept);
        }
        if (items.empty()) return exec(n.else_body, scope, out);
        const auto len = static_cast<int64_t>(items.size());
        for (int64_t k = 0; k < len; ++k) {
            assign(loop_scope, n.targets, items[static_cast<size_t>(k)]);
            Object loop;
            loop.items.reserve(12);
            loop.set("index", Value(k + 1));
            loop.set("index0", Value(k));
            loop.set("revindex", Value(len - k));
            loop.set("revindex0", Value(len - k - 1));
            loop.set("first", Value(k == 0));
            loop.set("last", Value(k == len - 1));
            loop.set("length", Value(len));
            loop.set("depth", Value(int64_t{1}));
            loop.set("depth0", Value(int64_t{0}));
            if (k > 0) loop.set("previtem", items[static_cast<size_t>(k - 1)]);
            if (k + 1 < len) loop.set("nextitem", items[static_cast<size_t>(k + 1)]);
            loop.set("cycle", make_function("loop.cycle", [k](CallArgs& a) -> Value {
                         if (a.positional.empty()) eval_fail("loop.cycle() needs at least one argument");
                         return a.positional[static_cast<size_t>(k) % a.positional.size()];
                     }));
            loop_scope.vars["loop"] = Value(std::move(loop));
            const Flow f = exec(n.body, loop_scope, out);
            if (f == Flow::Break) break;
        }
        return Flow::Normal;
    }

    // A macro (or a call block's caller) as a callable. `closure` is the defining scope for call
    // blocks; macros see the template's globals.
    Value make_macro(const Node& n, Scope* closure) {
        const Node* node = &n;
        Scope* parent = closure ? closure : &globals_;
        const std::string macro_name = n.type == Node::Type::Macro ? n.text : "caller";
        return make_function(macro_name, [this, node, parent, macro_name](CallArgs& a) -> Value {
            if (call_depth_ >= kMaxCallDepth) eval_fail("macro calls nest too deep (recursion?)");
            struct Depth {
                int& d;
                ~Depth() { --d; }
            } depth{++call_depth_};
            Scope local;
            local.parent = parent;
            if (a.positional.size() > node->targets.size())
                eval_fail(fmt::format("macro '{}' takes not more than {} argument(s)", macro_name, node->targets.size()));
            for (size_t k = 0; k < node->targets.size(); ++k) {
                const std::string& p = node->targets[k];
                if (k < a.positional.size()) local.vars[p] = a.positional[k];
                else if (const Value* v = a.get_kw(p)) local.vars[p] = *v;
                else if (node->defaults[k]) local.vars[p] = eval(*node->defaults[k], local);
                else local.vars[p] = Value::undefined(p);
            }
            for (const auto& [k, v] : a.keyword) {
                if (k == "caller") {
                    local.vars["caller"] = v;
                    continue;
                }
                if (std::find(node->targets.begin(), node->targets.end(), k) == node->targets.end())
                    eval_fail(fmt::format("macro '{}' takes no keyword argument '{}'", macro_name, k));
            }
            std::string text;
            exec(node->body, local, text);
            return Value(std::move(text));
        });
    }

    CallArgs eval_args(const Expr& e, size_t first, Scope& scope) {
        CallArgs a;
        const size_t n_pos = e.n_positional_args(first);
        for (size_t k = 0; k < n_pos; ++k) a.positional.push_back(eval(*e.args[first + k], scope));
        for (size_t k = 0; k < e.kw_names.size(); ++k)
            a.keyword.emplace_back(e.kw_names[k], eval(*e.args[first + n_pos + k], scope));
        return a;
    }

    // ---- expressions ----

    Value eval(const Expr& e, Scope& scope) {
        switch (e.type) {
            case Expr::Type::Literal: return e.literal;
            case Expr::Type::Name: {
                const Value* v = scope.find(e.name);
                return v ? *v : Value::undefined("'" + e.name + "' is undefined");
            }
            case Expr::Type::GetAttr: return get_attr(eval(*e.args[0], scope), e.name);
            case Expr::Type::GetItem: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
            case Expr::Type::Slice: {
                const Value obj = eval(*e.args[0], scope);
                Value parts[3];
                for (int k = 0; k < 3; ++k)
                    if (e.args[static_cast<size_t>(k) + 1]) parts[k] = eval(*e.args[static_cast<size_t>(k) + 1], scope);
                require_defined(obj);
                if (obj.is_string()) {
                    const auto cps = code_points(obj.str());
                    std::string out;
                    for (size_t k : slice_indices(static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2]))
                        utf8::append(out, cps[k]);
                    return Value(std::move(out));
                }
                if (obj.is_array()) {
                    Array out;
                    for (size_t k : slice_indices(static_cast<int64_t>(obj.array().size()), parts[0], parts[1], parts[2]))
                        out.push_back(obj.array()[k]);
                    return Value(std::move(out));
                }
                eval_fail("'" + obj.type_name() + "' object is not subscriptable");
            }
            case Expr::Type::Call: {
                const Value callee = eval(*e.args[0], scope);
                if (!callee.is_callable()) {
                    require_defined(callee);
                    eval_fail("'" + callee.type_name() + "' object is not callable");
                }
                CallArgs a = eval_args(e, 1, scope);
                return callee.callable().fn(a);
            }
            case Expr::Type::Filter: {
                Value input = eval(*e.args[0], scope);
                CallArgs a = eval_args(e, 1, scope);
                return apply_filter(e.name, std::move(input), a);
            }
            case Expr::Type::Test: {
                // `x is defined` must not fail on an undefined x.
                Value input = eval(*e.args[0], scope);
                CallArgs a = eval_args(e, 1, scope);
                const bool r = apply_test(e.name, input, a);
                return Value(e.negated ? !r : r);
            }
            case Expr::Type::Unary: {
                const Value v = eval(*e.args[0], scope);
                if (!v.is_number()) eval_fail("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
                if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
                return v.is_float() ? Value(-v.as_double()) : Value(sub(0, v.as_int()));
            }
            case Expr::Type::Binary: return binary(e.name, eval(*e.args[0], scope), eval(*e.args[1], scope));
            case Expr::Type::And: {
                Value a = eval(*e.args[0], scope);
                return a.truthy() ? eval(*e.args[1], scope) : a;
            }
            case Expr::Type::Or: {
                Value a = eval(*e.args[0], scope);
                return a.truthy() ? a : eval(*e.args[1], scope);
            }
            case Expr::Type::Not: return Value(!eval(*e.args[0], scope).truthy());
            case Expr::Type::Compare: {
                Value left = eval(*e.args[0], scope);
                for (size_t k = 0; k < e.ops.size(); ++k) {
                    Value right = eval(*e.args[k + 1], scope);
                    if (!compare(e.ops[k], left, right)) return Value(false);
                    left = std::move(right);
                }
                return Value(true);
            }
            case Expr::Type::Cond:
                if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
                return e.args[2] ? eval(*e.args[2], scope) : Value::undefined();
            case Expr::Type::List:
            case Expr::Type::Tuple: {
                Array a;
                for (const auto& x : e.args) a.push_back(eval(*x, scope));
                return Value(std::move(a));
            }
            case Expr::Type::Dict: {
                Object o;
                for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
                    const Value key = eval(*e.args[k], scope);
                    if (!key.is_string()) eval_fail("only string keys are supported in dict literals");
                    o.set(key.str(), eval(*e.args[k + 1], scope));
                }
                return Value(std::move(o));
            }
        }
        eval_fail("internal: unknown expression");
    }

    static void require_defined(const Value& v) {
        if (v.is_undefined()) eval_fail(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
    }

    static bool compare(const std::string& op, const Value& a, const Value& b) {
        if (op == "==") return a == b;
        if (op == "!=") return !(a == b);
        if (op == "in") return contains(b, a);
        if (op == "notin") return !contains(b, a);
        if (op == "<") return less_than(a, b);
        if (op == ">") return less_than(b, a);
        if (op == "<=") return !less_than(b, a);
        if (op == ">=") return !less_than(a, b);
        eval_fail("unknown comparison " + op);
    }

    static int64_t checked(bool overflow, int64_t r) {
        if (overflow) eval_fail("integer overflow (Python ints are unbounded; this engine stops at 64 bits)");
        return r;
    }
    static int64_t add(int64_t x, int64_t y) {
        int64_t r;
        const bool overflow = __builtin_add_overflow(x, y, &r);
        return checked(overflow, r);
    }
    static int64_t sub(int64_t x, int64_t y) {
        int64_t r;
        const bool overflow = __builtin_sub_overflow(x, y, &r);
        return checked(overflow, r);
    }
    static int64_t mul(int64_t x, int64_t y) {
        int64_t r;
        const bool overflow = __builtin_mul_overflow(x, y, &r);
        return checked(overflow, r);
    }
    static constexpr size_t kMaxStringBytes = size_t{1} << 26;  // bound on what `*` may build

    static Value binary(const std::string& op, const Value& a, const Value& b) {
        if (op == "~") return Value(a.to_str() + b.to_str());
        const bool nums = a.is_number() && b.is_number();
        const bool floats = nums && (a.is_float() || b.is_float());
        auto type_error = [&]() -> Value {
            eval_fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
        };
        if (op == "+") {
            if (nums) return floats ? Value(a.as_double() + b.as_double()) : Value(add(a.as_int(), b.as_int()));
            if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
            if (a.is_array() && b.is_array()) {
                Array r = a.array();
                r.insert(r.end(), b.array().begin(), b.array().end());
                return Value(std::move(r));
            }
            if (a.is_undefined() || b.is_undefined()) require_defined(a.is_undefined() ? a : b);
            return type_error();
        }
        if (op == "-") {
            if (!nums) return type_error();
            return floats ? Value(a.as_double() - b.as_double()) : Value(sub(a.as_int(), b.as_int()));
        }
        if (op == "*") {
            if (nums) return floats ? Value(a.as_double() * b.as_double()) : Value(mul(a.as_int(), b.as_int()));
            const Value* seq = a.is_number() ? &b : &a;
            const Value* count = a.is_number() ? &a : &b;
            if (count->is_float() || !count->is_number()) return type_error();
            const int64_t n = std::max<int64_t>(0, count->as_int());
            const size_t unit = seq->is_string() ? seq->str().size() : seq->is_array() ? seq->array().size() * 16 : 0;
            if (unit > 0 && static_cast<uint64_t>(n) > kMaxStringBytes / unit) eval_fail("repetition result is too large");
            if (seq->is_string()) {
                std::string r;
                for (int64_t k = 0; k < n; ++k) r += seq->str();
                return Value(std::move(r));
            }
            if (seq->is_array()) {
                Array r;
                for (int64_t k = 0; k < n; ++k) r.insert(r.end(), seq->array().begin(), seq->array().end());
                return Value(std::move(r));
            }
            return type_error();
        }
        if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));
        if (!nums) return type_error();
        if (op == "/") {
            if (b.as_double() == 0) eval_fail("division by zero");
            return Value(a.as_double() / b.as_double());
        }
        if (op == "//") {
            if (b.as_double() == 0) eval_fail("integer division or modulo by zero");
            if (floats) return Value(std::floor(a.as_double() / b.as_double()));
            const int64_t x = a.as_int(), y = b.as_int();
            if (x == INT64_MIN && y == -1) eval_fail("integer overflow");
            int64_t q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
            return Value(q);
        }
        if (op == "%") {
            if (b.as_double() == 0) eval_fail("integer division or modulo by zero");
            if (floats) {
                const double x = a.as_double(), y = b.as_double();
                double r = std::fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                return Value(r);
            }
            const int64_t x = a.as_int(), y = b.as_int();
            if (y == -1) return Value(int64_t{0});
            int64_t r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
            return Value(r);
        }
        if (op == "**") {
            if (!floats && b.as_int() >= 0) {
                // Square-and-multiply with overflow checks (no loop over the exponent).
                int64_t result = 1, base = a.as_int();
                for (int64_t e = b.as_int(); e > 0; e >>= 1) {
                    if (e & 1) result = mul(result, base);
                    if (e > 1) base = mul(base, base);
                }
                return Value(result);
            }
            return Value(std::pow(a.as_double(), b.as_double()));
        }
        eval_fail("unknown operator " + op);
    }

    // ---- attribute / item access, methods ----

    static Value get_item(const Value& obj, const Value& key) {
        require_defined(obj);
        if (obj.is_object()) {
            if (key.is_string())
                if (const Value* v = obj.object().find(key.str())) return *v;
            return Value::undefined("'dict object' has no attribute " + key.repr());
        }
        if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
            int64_t i = key.as_int();
            if (obj.is_array()) {
                const auto n = static_cast<int64_t>(obj.array().size());
                if (i < 0) i += n;
                if (i < 0 || i >= n) return Value::undefined("list index out of range");
                return obj.array()[static_cast<size_t>(i)];
            }
            const auto cps = code_points(obj.str());
            const auto n = static_cast<int64_t>(cps.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return Value::undefined("string index out of range");
            return Value(from_code_points(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
        }
        if (key.is_string()) return get_attr(obj, key.str());
        return Value::undefined("'" + obj.type_name() + "' object has no item " + key.repr());
    }

    static Value get_attr(const Value& obj, const std::string& name) {
        require_defined(obj);
        if (obj.is_object()) {
            if (!obj.object().is_namespace) {
                if (Value m = dict_method(obj, name); m.is_callable()) return m;
            }
            if (const Value* v = obj.object().find(name)) return *v;
            return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
        }
        if (obj.is_string()) {
            if (Value m = string_method(obj, name); m.is_callable()) return m;
        } else if (obj.is_array()) {
            if (Value m = list_method(obj, name); m.is_callable()) return m;
        }
        return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
    }

    static Value dict_method(const Value& obj, const std::string& name) {
        if (name == "items")
            return make_function("dict.items", [obj](CallArgs&) -> Value {
                Array out;
                for (const auto& [k, v] : obj.object().items) out.push_back(Value(Array{Value(k), v}));
                return Value(std::move(out));
            });
        if (name == "keys")
            return make_function("dict.keys", [obj](CallArgs&) -> Value {
                Array out;
                for (const auto& kv : obj.object().items) out.emplace_back(kv.first);
                return Value(std::move(out));
            });
        if (name == "values")
            return make_function("dict.values", [obj](CallArgs&) -> Value {
                Array out;
                for (const auto& kv : obj.object().items) out.push_back(kv.second);
                return Value(std::move(out));
            });
        if (name == "get")
            return make_function("dict.get", [obj](CallArgs& a) -> Value {
                if (a.positional.empty()) eval_fail("dict.get() takes at least 1 argument");
                const Value& key = a.positional[0];
                if (key.is_string())
                    if (const Value* v = obj.object().find(key.str())) return *v;
                return a.positional.size() > 1 ? a.positional[1] : Value::none();
            });
        if (name == "copy") return make_function("dict.copy", [obj](CallArgs&) -> Value { return Value(Object(obj.object())); });
        if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" || name == "clear")
            return make_function("dict." + name, [name](CallArgs&) -> Value {
                eval_fail("dict." + name + "() is not allowed: templates render in an immutable sandbox (as in transformers)");
            });
        return Value();
    }

    static Value list_method(const Value& obj, const std::string& name) {
        if (name == "index")
            return make_function("list.index", [obj](CallArgs& a) -> Value {
                if (a.positional.empty()) eval_fail("list.index() takes 1 argument");
                for (size_t k = 0; k < obj.array().size(); ++k)
                    if (obj.array()[k] == a.positional[0]) return Value(static_cast<int64_t>(k));
                eval_fail(a.positional[0].repr() + " is not in list");
            });
        if (name == "count")
            return make_function("list.count", [obj](CallArgs& a) -> Value {
                if (a.positional.empty()) eval_fail("list.count() takes 1 argument");
                return Value(static_cast<int64_t>(std::count(obj.array().begin(), obj.array().end(), a.positional[0])));
            });
        if (name == "copy") return make_function("list.copy", [obj](CallArgs&) -> Value { return Value(Array(obj.array())); });
        if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
            name == "clear" || name == "sort" || name == "reverse")
            return make_function("list." + name, [name](CallArgs&) -> Value {
                eval_fail("list." + name + "() is not allowed: templates render in an immutable sandbox (as in transformers)");
            });
        return Value();
    }

    static Value string_method(const Value& obj, const std::string& name) {
        const std::string s = obj.str();
        auto fn = [&](std::function<Value(CallArgs&)> f) { return make_function("str." + name, std::move(f)); };
        static const Value none = Value::none();
        if (name == "upper") return fn([s](CallArgs&) { return Value(map_case(s, to_upper)); });
        if (name == "lower") return fn([s](CallArgs&) { return Value(map_case(s, to_lower)); });
        if (name == "strip") return fn([s](CallArgs& a) { return Value(py_strip(s, arg_at(a, 0, "chars", none), true, true)); });
        if (name == "lstrip") return fn([s](CallArgs& a) { return Value(py_strip(s, arg_at(a, 0, "chars", none), true, false)); });
        if (name == "rstrip") return fn([s](CallArgs& a) { return Value(py_strip(s, arg_at(a, 0, "chars", none), false, true)); });
        if (name == "split" || name == "rsplit")
            return fn([s, name](CallArgs& a) {
                const Value& sep = arg_at(a, 0, "sep", none);
                const Value& maxv = arg_at(a, 1, "maxsplit", Value(int64_t{-1}));
                int64_t maxsplit = maxv.is_number() ? maxv.as_int() : -1;
                if (name == "rsplit" && maxsplit >= 0) eval_fail("str.rsplit with maxsplit is not supported");
                Array out;
                for (auto& p : py_split(s, &sep, maxsplit)) out.emplace_back(std::move(p));
                return Value(std::move(out));
            });
        if (name == "splitlines")
            return fn([s](CallArgs&) {
                Array out;
                for (auto& p : py_splitlines(s)) out.emplace_back(std::move(p));
                return Value(std::move(out));
            });
        if (name == "startswith" || name == "endswith")
            return fn([s, name](CallArgs& a) {
                if (a.positional.empty()) eval_fail("str." + name + "() takes at least 1 argument");
                const Value& p = a.positional[0];
                Array options = p.is_array() ? p.array() : Array{p};
                for (const auto& o : options) {
                    if (!o.is_string()) eval_fail(name + " first arg must be str or a tuple of str");
                    const std::string& x = o.str();
                    if (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                             : (s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0))
                        return Value(true);
                }
                return Value(false);
            });
        if (name == "replace")
            return fn([s](CallArgs& a) {
                if (a.positional.size() < 2 || !a.positional[0].is_string() || !a.positional[1].is_string())
                    eval_fail("str.replace() takes two strings");
                const int64_t count = a.positional.size() > 2 ? a.positional[2].as_int() : -1;
                return Value(py_replace(s, a.positional[0].str(), a.positional[1].str(), count));
            });
        if (name == "title") return fn([s](CallArgs&) { return Value(py_title(s)); });
        if (name == "capitalize") return fn([s](CallArgs&) { return Value(py_capitalize(s)); });
        if (name == "find" || name == "rfind" || name == "index" || name == "count")
            return fn([s, name](CallArgs& a) {
                if (a.positional.empty() || !a.positional[0].is_string()) eval_fail("str." + name + "() takes a string");
                const std::string& x = a.positional[0].str();
                if (name == "count") {
                    if (x.empty()) return Value(static_cast<int64_t>(utf8::count(s) + 1));
                    int64_t n = 0;
                    for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++n;
                    return Value(n);
                }
                const size_t p = name == "rfind" ? s.rfind(x) : s.find(x);
                if (p == std::string::npos) {
                    if (name == "index") eval_fail("substring not found");
                    return Value(int64_t{-1});
                }
                return Value(static_cast<int64_t>(utf8::count(std::string_view(s).substr(0, p))));
            });
        if (name == "join")
            return fn([s](CallArgs& a) {
                if (a.positional.empty()) eval_fail("str.join() takes 1 argument");
                std::string out;
                bool first = true;
                for (const auto& v : iterate(a.positional[0])) {
                    if (!v.is_string()) eval_fail("sequence item: expected str instance, " + v.type_name() + " found");
                    if (!first) out += s;
                    out += v.str();
                    first = false;
                }
                return Value(std::move(out));
            });
        if (name == "format")
            return fn([s](CallArgs& a) {
                // "{}", "{0}", "{name}" replacement fields; no format specs.
                std::string out;
                size_t auto_index = 0;
                for (size_t i = 0; i < s.size(); ++i) {
                    if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') {
                        out.push_back('{');
                        ++i;
                    } else if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') {
                        out.push_back('}');
                        ++i;
                    } else if (s[i] == '{') {
                        const size_t close = s.find('}', i);
                        if (close == std::string::npos) eval_fail("str.format: single '{' encountered");
                        const std::string field = s.substr(i + 1, close - i - 1);
                        if (field.find_first_of(":!") != std::string::npos) eval_fail("str.format: format specs are not supported");
                        const Value* v = nullptr;
                        if (field.empty()) {
                            if (auto_index < a.positional.size()) v = &a.positional[auto_index++];
                        } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
                            const size_t k = std::stoul(field);
                            if (k < a.positional.size()) v = &a.positional[k];
                        } else {
                            v = a.get_kw(field);
                        }
                        if (!v) eval_fail("str.format: missing argument for {" + field + "}");
                        out += v->to_str();
                        i = close;
                    } else {
                        out.push_back(s[i]);
                    }
                }
                return Value(std::move(out));
            });
        auto all_cps = [s](bool (*pred)(char32_t)) {
            if (s.empty()) return false;
            for (size_t i = 0; i < s.size();)
                if (!pred(utf8::next(s, i))) return false;
            return true;
        };
        if (name == "isdigit")
            return fn([all_cps](CallArgs&) { return Value(all_cps([](char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; })); });
        if (name == "isalpha")
            return fn([all_cps](CallArgs&) {
                return Value(all_cps([](char32_t c) { return category(c) >= UTF8PROC_CATEGORY_LU && category(c) <= UTF8PROC_CATEGORY_LO; }));
            });
        if (name == "isalnum")
            return fn([all_cps](CallArgs&) {
                return Value(all_cps([](char32_t c) {
                    const auto cat = category(c);
                    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
                }));
            });
        if (name == "isspace") return fn([all_cps](CallArgs&) { return Value(all_cps(py_isspace)); });
        if (name == "isupper" || name == "islower")
            return fn([s, name](CallArgs&) {
                bool any_cased = false;
                for (size_t i = 0; i < s.size();) {
                    const char32_t c = utf8::next(s, i);
                    if (!is_cased(c)) continue;
                    any_cased = true;
                    if ((name == "isupper") ? to_upper(c) != c : to_lower(c) != c) return Value(false);
                }
                return Value(any_cased);
            });
        return Value();
    }

    // ---- filters ----

    Value call_filter_by_name(const std::string& name, Value v, const Array& extra) {
        if (!is_known_filter(name)) eval_fail("unsupported filter '" + name + "'");
        CallArgs a;
        a.positional = extra;
        return apply_filter(name, std::move(v), a);
    }

    Value apply_filter(const std::string& name, Value v, CallArgs& a) {
        static const Value none = Value::none();
        static const Value empty_str = Value(std::string());
        static const Value vfalse = Value(false);
        if (name == "safe") return v;
        if (name == "default" || name == "d") {
            const bool boolean = arg_at(a, 1, "boolean", vfalse).truthy();
            if (v.is_undefined() || (boolean && !v.truthy())) return arg_at(a, 0, "default_value", empty_str);
            return v;
        }
        if (name == "length" || name == "count") return Value(length_of(v));
        if (name == "string") return Value(v.to_str());
        if (name == "tojson") {
            Value::JsonOptions opt;
            const Value& indent = arg_at(a, 0, "indent", none);
            if (indent.is_number()) {
                opt.indent = static_cast<int>(indent.as_int());
                opt.item_sep = ",";
            } else if (indent.is_string()) {
                eval_fail("tojson: string indent is not supported");
            }
            if (const Value* sep = a.get_kw("separators"); sep && sep->is_array()) {
                if (sep->array().size() != 2) eval_fail("tojson: separators must be a pair");
                opt.item_sep = sep->array()[0].to_str();
                opt.key_sep = sep->array()[1].to_str();
            }
            if (const Value* sk = a.get_kw("sort_keys")) opt.sort_keys = sk->truthy();
            if (const Value* ea = a.get_kw("ensure_ascii")) opt.ensure_ascii = ea->truthy();
            return Value(v.to_json(opt));
        }
        if (name == "trim") return Value(py_strip(v.to_str(), arg_at(a, 0, "chars", none), true, true));
        if (name == "upper") return Value(map_case(v.to_str(), to_upper));
        if (name == "lower") return Value(map_case(v.to_str(), to_lower));
        if (name == "capitalize") return Value(py_capitalize(v.to_str()));
        if (name == "title") return Value(jinja_title(v.to_str()));
        if (name == "replace") {
            const Value& from = arg_at(a, 0, "old", none);
            const Value& to = arg_at(a, 1, "new", none);
            const Value& count = arg_at(a, 2, "count", none);
            return Value(py_replace(v.to_str(), from.to_str(), to.to_str(), count.is_number() ? count.as_int() : -1));
        }
        if (name == "items") {
            if (v.is_undefined()) return Value(Array{});
            if (!v.is_object()) eval_fail("items filter expects a mapping, got " + v.type_name());
            Array out;
            for (const auto& [k, x] : v.object().items) out.push_back(Value(Array{Value(k), x}));
            return Value(std::move(out));
        }
        if (name == "list") return Value(iterate(v));
        if (name == "first" || name == "last") {
            Array items = iterate(v);
            if (items.empty()) return Value::undefined("no first/last item of an empty sequence");
            return name == "first" ? items.front() : items.back();
        }
        if (name == "reverse") {
            if (v.is_string()) {
                auto cps = code_points(v.str());
                std::reverse(cps.begin(), cps.end());
                return Value(from_code_points(cps, 0, cps.size()));
            }
            Array items = iterate(v);
            std::reverse(items.begin(), items.end());
            return Value(std::move(items));
        }
        if (name == "join") {
            const Value& sep = arg_at(a, 0, "d", empty_str);
            const Value& attribute = arg_at(a, 1, "attribute", none);
            std::string out;
            bool first = true;
            for (const auto& item : iterate(v)) {
                if (!first) out += sep.to_str();
                out += (attribute.is_none() ? item : get_attr_path(item, attribute)).to_str();
                first = false;
            }
            return Value(std::move(out));
        }
        if (name == "map") {
            Array out;
            if (const Value* attribute = a.get_kw("attribute")) {
                const Value* dflt = a.get_kw("default");
                for (const auto& item : iterate(v)) {
                    Value x = get_attr_path(item, *attribute);
                    out.push_back(x.is_undefined() && dflt ? *dflt : x);
                }
                return Value(std::move(out));
            }
            if (a.positional.empty() || !a.positional[0].is_string()) eval_fail("map: expected a filter name or attribute=");
            const std::string fname = a.positional[0].str();
            const Array extra(a.positional.begin() + 1, a.positional.end());
            for (const auto& item : iterate(v)) out.push_back(call_filter_by_name(fname, item, extra));
            return Value(std::move(out));
        }
        if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
            const bool by_attr = name == "selectattr" || name == "rejectattr";
            const bool keep_if = name == "select" || name == "selectattr";
            size_t k = 0;
            Value attribute;
            if (by_attr) {
                if (a.positional.empty()) eval_fail(name + ": missing attribute name");
                attribute = a.positional[k++];
            }
            std::string test;
            if (k < a.positional.size()) {
                if (!a.positional[k].is_string()) eval_fail(name + ": test name must be a string");
                test = a.positional[k++].str();
                if (!is_known_test(test)) eval_fail("unsupported test '" + test + "'");
            }
            CallArgs targs;
            targs.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(k), a.positional.end());
            Array out;
            for (const auto& item : iterate(v)) {
                const Value x = by_attr ? get_attr_path(item, attribute) : item;
                const bool r = test.empty() ? x.truthy() : apply_test(test, x, targs);
                if (r == keep_if) out.push_back(item);
            }
            return Value(std::move(out));
        }
        if (name == "unique") {
            const bool case_sensitive = arg_at(a, 0, "case_sensitive", vfalse).truthy();
            const Value& attribute = arg_at(a, 1, "attribute", none);
            Array out;
            std::vector<Value> seen;
            for (const auto& item : iterate(v)) {
                Value key = attribute.is_none() ? item : get_attr_path(item, attribute);
                if (!case_sensitive && key.is_string()) key = Value(map_case(key.str(), to_lower));
                if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
                seen.push_back(key);
                out.push_back(item);
            }
            return Value(std::move(out));
        }
        if (name == "sort" || name == "min" || name == "max") {
            const bool reverse = name == "sort" && arg_at(a, 0, "reverse", vfalse).truthy();
            const bool case_sensitive = arg_at(a, name == "sort" ? 1 : 0, "case_sensitive", vfalse).truthy();
            const Value& attribute = arg_at(a, name == "sort" ? 2 : 1, "attribute", none);
            Array items = iterate(v);
            auto key = [&](const Value& x) {
                Value k = attribute.is_none() ? x : get_attr_path(x, attribute);
                if (!case_sensitive && k.is_string()) k = Value(map_case(k.str(), to_lower));
                return k;
            };
            auto cmp = [&](const Value& x, const Value& y) { return less_than(key(x), key(y)); };
            if (name == "sort") {
                std::stable_sort(items.begin(), items.end(), cmp);
                if (reverse) std::reverse(items.begin(), items.end());
                return Value(std::move(items));
            }
            if (items.empty()) return Value::undefined("no min/max of an empty sequence");
            return name == "min" ? *std::min_element(items.begin(), items.end(), cmp)
                                 : *std::max_element(items.begin(), items.end(), cmp);
        }
        if (name == "dictsort") {
            if (!v.is_object()) eval_fail("dictsort expects a mapping, got " + v.type_name());
            const bool case_sensitive = arg_at(a, 0, "case_sensitive", vfalse).truthy();
            const std::string by = arg_at(a, 1, "by", Value("key")).to_str();
            const bool reverse = arg_at(a, 2, "reverse", vfalse).truthy();
            Array items;
            for (const auto& [k, x] : v.object().items) items.push_back(Value(Array{Value(k), x}));
            const size_t idx = by == "value" ? 1 : 0;
            std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
                Value p = x.array()[idx], q = y.array()[idx];
                if (!case_sensitive && p.is_string()) p = Value(map_case(p.str(), to_lower));
                if (!case_sensitive && q.is_string()) q = Value(map_case(q.str(), to_lower));
                return less_than(p, q);
            });
            if (reverse) std::reverse(items.begin(), items.end());
            return Value(std::move(items));
        }
        if (name == "sum") {
            const Value& attribute = arg_at(a, 0, "attribute", none);
            Value total = arg_at(a, 1, "start", Value(int64_t{0}));
            for (const auto& item : iterate(v)) total = binary("+", total, attribute.is_none() ? item : get_attr_path(item, attribute));
            return total;
        }
        if (name == "int") {
            const Value& dflt = arg_at(a, 0, "default", Value(int64_t{0}));
            if (v.is_number()) return Value(static_cast<int64_t>(v.is_float() ? std::trunc(v.as_double()) : v.as_int()));
            if (v.is_string()) {
                const std::string s = py_strip(v.str(), Value::none(), true, true);
                try {
                    size_t used = 0;
                    const long long x = std::stoll(s, &used, 10);
                    if (used == s.size()) return Value(static_cast<int64_t>(x));
                    const double d = std::stod(s, &used);
                    if (used == s.size()) return Value(static_cast<int64_t>(std::trunc(d)));
                } catch (const std::exception&) {
                }
            }
            return dflt;
        }
        if (name == "float") {
            const Value& dflt = arg_at(a, 0, "default", Value(0.0));
            if (v.is_number()) return Value(v.as_double());
            if (v.is_string()) {
                try {
                    size_t used = 0;
                    const std::string s = py_strip(v.str(), Value::none(), true, true);
                    const double d = std::stod(s, &used);
                    if (used == s.size()) return Value(d);
                } catch (const std::exception&) {
                }
            }
            return dflt;
        }
        if (name == "abs") {
            if (!v.is_number()) eval_fail("bad operand type for abs(): '" + v.type_name() + "'");
            return v.is_float() ? Value(std::fabs(v.as_double())) : Value(static_cast<int64_t>(std::llabs(v.as_int())));
        }
        if (name == "round") {
            const int64_t precision = arg_at(a, 0, "precision", Value(int64_t{0})).as_int();
            const std::string method = arg_at(a, 1, "method", Value("common")).to_str();
            if (!v.is_number()) eval_fail("round expects a number");
            const double scale = std::pow(10.0, static_cast<double>(precision));
            const double x = v.as_double() * scale;
            double r;
            if (method == "common") r = std::round(x);
            else if (method == "floor") r = std::floor(x);
            else if (method == "ceil") r = std::ceil(x);
            else eval_fail("round: method must be common, ceil or floor");
            return Value(r / scale);
        }
        if (name == "indent") {
            const Value& width_v = arg_at(a, 0, "width", Value(int64_t{4}));
            if (!width_v.is_string() && (width_v.as_int() < 0 || width_v.as_int() > 10000)) eval_fail("indent: bad width");
            const bool first = arg_at(a, 1, "first", vfalse).truthy();
            const bool blank = arg_at(a, 2, "blank", vfalse).truthy();
            const std::string indent = width_v.is_string() ? width_v.str() : std::string(static_cast<size_t>(width_v.as_int()), ' ');
            const auto lines = py_splitlines(v.to_str() + "\n");
            std::string out;
            for (size_t k = 0; k < lines.size(); ++k) {
                if (k == 0) {
                    out += lines[0];
                    continue;
                }
                out += "\n";
                if (blank || !lines[k].empty()) out += indent;
                out += lines[k];
            }
            return Value(first ? indent + out : out);
        }
        if (name == "center") {
            const int64_t width = arg_at(a, 0, "width", Value(int64_t{80})).as_int();
            if (width > 100000) eval_fail("center: width is too large");
            const std::string s = v.to_str();
            const auto n = static_cast<int64_t>(utf8::count(s));
            if (n >= width) return Value(s);
            const int64_t total = width - n;
            const int64_t left = total / 2 + (total & width & 1);  // Python's str.center split
            return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(total - left), ' '));
        }
        if (name == "wordcount") return Value(static_cast<int64_t>(py_split(v.to_str(), nullptr, -1).size()));
        if (name == "e" || name == "escape") {
            std::string out;
            for (char c : v.to_str()) {
                switch (c) {
                    case '&': out += "&amp;"; break;
                    case '<': out += "&lt;"; break;
                    case '>': out += "&gt;"; break;
                    case '"': out += "&#34;"; break;
                    case '\'': out += "&#39;"; break;
                    default: out.push_back(c);
                }
            }
            return Value(std::move(out));
        }
        if (name == "format") {
            Array args = a.positional;
            return Value(percent_format(v.to_str(), Value(std::move(args))));
        }
        if (name == "attr") return get_attr(v, arg_at(a, 0, "name", empty_str).to_str());
        eval_fail("unsupported filter '" + name + "'");
    }

    // "a.b.0" attribute paths as jinja2's make_attrgetter reads them.
    static Value get_attr_path(const Value& item, const Value& path) {
        if (path.is_int()) return get_item(item, path);
        Value cur = item;
        const Value dot(".");
        for (const auto& part : py_split(path.to_str(), &dot, -1)) {
            if (cur.is_undefined()) return cur;
            if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit))
                cur = get_item(cur, Value(static_cast<int64_t>(std::stoll(part))));
            else
                cur = get_item(cur, Value(part));
        }
        return cur;
    }

    // ---- tests ----

    static bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
        auto arg = [&]() -> const Value& {
            if (a.positional.empty()) eval_fail("test '" + name + "' needs an argument");
            return a.positional[0];
        };
        if (name == "defined") return !v.is_undefined();
        if (name == "undefined") return v.is_undefined();
        if (name == "none") return v.is_none();
        if (name == "boolean") return v.is_bool();
        if (name == "true") return v.is_bool() && v.as_bool();
        if (name == "false") return v.is_bool() && !v.as_bool();
        if (name == "string") return v.is_string();
        if (name == "mapping") return v.is_object();
        if (name == "number") return v.is_number();
        if (name == "integer") return v.is_int();
        if (name == "float") return v.is_float();
        if (name == "iterable") return v.is_array() || v.is_object() || v.is_string();
        if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
        if (name == "callable") return v.is_callable();
        if (name == "odd" || name == "even") {
            if (!v.is_int() && !v.is_bool()) eval_fail("test '" + name + "' expects an integer");
            const int64_t r = ((v.as_int() % 2) + 2) % 2;
            return name == "odd" ? r == 1 : r == 0;
        }
        if (name == "divisibleby") {
            const Value& d = arg();
            if (!d.is_number() || d.as_int() == 0) eval_fail("divisibleby needs a non-zero number");
            return v.as_int() % d.as_int() == 0;
        }
        if (name == "eq" || name == "equalto") return v == arg();
        if (name == "ne") return !(v == arg());
        if (name == "lt" || name == "lessthan") return less_than(v, arg());
        if (name == "gt" || name == "greaterthan") return less_than(arg(), v);
        if (name == "le") return !less_than(arg(), v);
        if (name == "ge") return !less_than(v, arg());
        if (name == "in") return contains(arg(), v);
        if (name == "sameas") {
            const Value& o = arg();
            if (v.kind() != o.kind()) return false;
            switch (v.kind()) {
                case Kind::Undefined:
                case Kind::None: return true;
                case Kind::Bool: return v.as_bool() == o.as_bool();
                case Kind::Int: return v.as_int() == o.as_int();  // small ints are interned in Python
                case Kind::Float: return false;
                default: return v.identity() == o.identity();
            }
        }
        if (name == "lower" || name == "upper") {
            if (!v.is_string()) return false;
            const std::string& s = v.str();
            return s == map_case(s, name == "lower" ? to_lower : to_upper);
        }
        eval_fail("unsupported test '" + name + "'");
    }

    static constexpr int kMaxCallDepth = 64;
    const std::string& name_;
    Scope& globals_;
    int call_depth_ = 0;
};

std::string strftime_now(const std::string& fmt_str) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, fmt_str.c_str(), &tm);
    return std::string(buf, n);
}

// `namespaces` collects every namespace() made during a render: they are the only mutable objects,
// so any reference cycle runs through one, and clearing them afterwards frees it.
void add_builtins(Scope& globals, std::vector<Value>& namespaces) {
    globals.vars["range"] = make_function("range", [](CallArgs& a) -> Value {
        for (const auto& v : a.positional)
            if (!v.is_int() && !v.is_bool()) eval_fail("range() arguments must be integers");
        int64_t start = 0, stop = 0, step = 1;
        if (a.positional.size() == 1) {
            stop = a.positional[0].as_int();
        } else if (a.positional.size() == 2 || a.positional.size() == 3) {
            start = a.positional[0].as_int();
            stop = a.positional[1].as_int();
            if (a.positional.size() == 3) step = a.positional[2].as_int();
        } else {
            eval_fail("range() takes 1 to 3 arguments");
        }
        if (step == 0) eval_fail("range() arg 3 must not be zero");
        Array out;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
            if (out.size() > 1000000) eval_fail("range() too large");
            out.emplace_back(k);
        }
        return Value(std::move(out));
    });
    globals.vars["namespace"] = make_function("namespace", [&namespaces](CallArgs& a) -> Value {
        Object o;
        o.is_namespace = true;
        for (const auto& p : a.positional) {
            if (!p.is_object()) eval_fail("namespace() positional argument must be a mapping");
            for (const auto& [k, v] : p.object().items) o.set(k, v);
        }
        for (const auto& [k, v] : a.keyword) o.set(k, v);
        Value ns(std::move(o));
        namespaces.push_back(ns);
        return ns;
    });
    globals.vars["dict"] = make_function("dict", [](CallArgs& a) -> Value {
        Object o;
        for (const auto& p : a.positional) {
            if (!p.is_object()) eval_fail("dict() positional argument must be a mapping");
            for (const auto& [k, v] : p.object().items) o.set(k, v);
        }
        for (const auto& [k, v] : a.keyword) o.set(k, v);
        return Value(std::move(o));
    });
    globals.vars["raise_exception"] = make_function("raise_exception", [](CallArgs& a) -> Value {
        eval_fail("raise_exception: " + (a.positional.empty() ? std::string() : a.positional[0].to_str()));
    });
    globals.vars["strftime_now"] = make_function("strftime_now", [](CallArgs& a) -> Value {
        if (a.positional.empty() || !a.positional[0].is_string()) eval_fail("strftime_now() takes a format string");
        return Value(strftime_now(a.positional[0].str()));
    });
}

}  // namespace

bool is_known_filter(const std::string& name) { return filter_names().count(name) != 0; }
bool is_known_test(const std::string& name) { return test_names().count(name) != 0; }

Template::Template(std::string source, std::string name) : name_(std::move(name)), root_(parse_template(source, name_)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
    if (!context.is_object()) scr::fail("{}: the render context must be an object", name_);
    std::vector<Value> namespaces;
    struct BreakCycles {
        std::vector<Value>& ns;
        ~BreakCycles() {
            for (auto& v : ns) v.object_mut().items.clear();
        }
    } break_cycles{namespaces};
    Scope globals;
    add_builtins(globals, namespaces);
    for (const auto& [k, v] : context.object().items) globals.vars[k] = v;
    Renderer r(name_, globals);
    std::string out;
    r.exec(root_->body, globals, out);
    return out;
}

}  // namespace scr::text::jinja
