// The architecture DSL's syntax tree. See docs/DSL.md for the language.
//
// A program is a header (`arch NAME for HFArch, ...`), `const` bindings from config.json, and
// statements that describe one forward pass. The compiler *executes* the statements once, with
// every constant known, to produce the dataflow graph (compiler/ir/graph.hpp); nothing of the
// DSL survives into the generated code.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace scr::dsl {

struct SourceLoc {
    std::string file;
    int line = 0, col = 0;
    std::string str() const { return file + ":" + std::to_string(line) + ":" + std::to_string(col); }
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
    number,     // 1e-6, 128
    string,     // "silu"
    boolean,    // true / false
    list,       // [a, b]
    name,       // hidden, model.embed_tokens, mlp.experts.{e}  (dotted path; resolved at bind)
    call,       // f(a, b, key=v)
    binary,     // a + b, a * b, a == b, a in b, a and b ...
    unary,      // -a, not a
    ternary,    // c ? a : b
    fallback,   // a | b : a when the config has it (and not null), else b
    shaped,     // e : [d0, d1]  (output shape of a producing call, without the token dim)
    index,      // a[i]  (an item of a compile-time list, e.g. layer_types[l])
};

struct Expr {
    ExprKind kind;
    SourceLoc loc;
    double number = 0;
    bool is_integer = false;
    std::string text;               // name path / string / operator / callee
    std::vector<ExprPtr> args;      // operands, list items, call args, shape dims
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;

enum class StmtKind { constant, assign, for_layers, if_else };

struct Stmt {
    StmtKind kind;
    SourceLoc loc;
    std::vector<std::string> targets;   // assign: one or more names; constant: one name
    ExprPtr value;                      // assign / constant value; for: the count; if: the condition
    std::string loop_var;               // for
    std::string prefix;                 // for: weight-path prefix, e.g. "model.layers.{l}"
    std::vector<StmtPtr> body;          // for / if-then
    std::vector<StmtPtr> orelse;        // if-else
};

struct Program {
    std::string file;
    std::string arch;                          // DSL name, e.g. "llama"
    std::vector<std::string> hf_architectures; // e.g. {"LlamaForCausalLM"}
    std::vector<StmtPtr> stmts;
    std::string source;                        // full text (quoted into the generated file)
};

}  // namespace scr::dsl
