// The Jinja syntax tree (internal to jinja_*.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/text/jinja.hpp"

namespace scr::text::jinja {

struct Expr {
    enum class Type {
        Literal,   // literal
        Name,      // name
        GetAttr,   // a[0].name
        GetItem,   // a[0][a[1]]
        Slice,     // a[0][a[1]:a[2]:a[3]] (null parts allowed)
        Call,      // a[0](a[1..]); the last kw_names.size() arguments are keywords
        Filter,    // a[0] | name(a[1..])
        Test,      // a[0] is [not] name(a[1..])
        Unary,     // name a[0]  ("-", "+")
        Binary,    // a[0] name a[1]  (+ - * / // % ** ~)
        And,
        Or,
        Not,
        Compare,   // a[0] ops[0] a[1] ops[1] a[2] ...  (== != < > <= >= in notin)
        Cond,      // a[0] if a[1] else a[2]
        List,
        Tuple,
        Dict,      // key, value, key, value...
    };
    Type type;
    int line = 0;
    Value literal;
    std::string name;
    std::vector<std::unique_ptr<Expr>> args;
    std::vector<std::string> kw_names;
    std::vector<std::string> ops;
    bool negated = false;

    Expr(Type t, int l) : type(t), line(l) {}
    size_t n_positional_args(size_t first) const { return args.size() - first - kw_names.size(); }
};

using ExprPtr = std::unique_ptr<Expr>;
struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
    enum class Type {
        Root,
        Text,         // text
        Output,       // {{ expr }}
        If,           // branches (cond, body)..., else_body
        For,          // targets in expr [if cond] body [else else_body]
        Set,          // targets = expr | attr_target.attr = expr
        SetBlock,     // {% set targets[0] %}body{% endset %}
        Macro,        // name(params = defaults) body
        CallBlock,    // {% call(params) expr %}body{% endcall %}
        FilterBlock,  // {% filter expr %}body — expr is a Filter chain over a Name "__body__"
        With,         // {% with targets = defaults %}body
        Break,
        Continue,
    };
    Type type;
    int line = 0;
    std::string text;
    ExprPtr expr;
    ExprPtr cond;
    Body body;
    Body else_body;
    std::vector<std::pair<ExprPtr, Body>> branches;
    std::vector<std::string> targets;  // names assigned (for/set/macro params/with)
    std::string attr;                  // Set on namespace attribute: targets[0].attr
    std::vector<ExprPtr> defaults;     // macro / call-block parameter defaults (null if none)

    Node(Type t, int l) : type(t), line(l) {}
};

// Parses a template into a Root node. `name` prefixes error messages.
std::unique_ptr<Node> parse_template(const std::string& source, const std::string& name);

// Whether the evaluator implements a filter / test (the parser rejects others up front).
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace scr::text::jinja
