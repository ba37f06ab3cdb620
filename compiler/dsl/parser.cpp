// Lexer and recursive-descent parser for the architecture DSL (indentation-structured, like
// Python). Every error carries file:line:col.
#include "compiler/dsl/parser.hpp"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include "runtime/core/error.hpp"

namespace scr::dsl {
namespace {

enum class Tok { name, number, string, op, newline, indent, dedent, end };

struct Token {
    Tok kind;
    std::string text;
    double number = 0;
    bool is_integer = false;
    int line = 0, col = 0;
};

const char* kKeywords[] = {"arch", "for", "in", "at", "if", "else", "elif", "const",
                           "and", "or", "not", "true", "false"};

bool is_keyword(const std::string& s) {
    for (auto k : kKeywords)
        if (s == k) return true;
    return false;
}

class Lexer {
public:
    Lexer(const std::string& file, const std::string& src) : file_(file), src_(src) {}

    std::vector<Token> run() {
        std::vector<int> indents{0};
        int line = 0;
        size_t pos = 0;
        while (pos < src_.size()) {
            ++line;
            size_t eol = src_.find('\n', pos);
            if (eol == std::string::npos) eol = src_.size();
            std::string text = src_.substr(pos, eol - pos);
            pos = eol + 1;
            // Strip comments (no '#' inside strings in this language).
            if (auto h = text.find('#'); h != std::string::npos) text.resize(h);
            if (!text.empty() && text.back() == '\r') text.pop_back();
            size_t first = text.find_first_not_of(" \t");
            if (first == std::string::npos) continue;  // blank line
            if (text.find('\t') < first) error(line, 1, "tabs are not allowed for indentation; use spaces");
            int indent = int(first);
            if (indent > indents.back()) {
                indents.push_back(indent);
                out_.push_back({Tok::indent, "", 0, false, line, 1});
            } else {
                while (indent < indents.back()) {
                    indents.pop_back();
                    out_.push_back({Tok::dedent, "", 0, false, line, 1});
                }
                if (indent != indents.back()) error(line, indent + 1, "indentation does not match any outer block");
            }
            lex_line(text, line, first);
            out_.push_back({Tok::newline, "", 0, false, line, int(text.size()) + 1});
        }
        while (indents.size() > 1) {
            indents.pop_back();
            out_.push_back({Tok::dedent, "", 0, false, line + 1, 1});
        }
        out_.push_back({Tok::end, "", 0, false, line + 1, 1});
        return std::move(out_);
    }

private:
    [[noreturn]] void error(int line, int col, const std::string& msg) {
        fail("{}:{}:{}: {}", file_, line, col, msg);
    }

    static bool ident_start(char c) { return std::isalpha((unsigned char)c) || c == '_'; }
    static bool ident_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }

    void lex_line(const std::string& s, int line, size_t i) {
        while (i < s.size()) {
            char c = s[i];
            int col = int(i) + 1;
            if (c == ' ' || c == '\t') { ++i; continue; }
            if (ident_start(c)) {
                // A dotted path: ident ( '.' (ident | digits | '{' ident '}') )*
                size_t j = i;
                while (j < s.size() && ident_char(s[j])) ++j;
                while (j + 1 < s.size() && s[j] == '.' &&
                       (ident_char(s[j + 1]) || s[j + 1] == '{')) {
                    ++j;
                    if (s[j] == '{') {
                        size_t close = s.find('}', j);
                        if (close == std::string::npos) error(line, int(j) + 1, "unclosed '{' in a weight path");
                        j = close + 1;
                    } else {
                        while (j < s.size() && ident_char(s[j])) ++j;
                    }
                }
                out_.push_back({Tok::name, s.substr(i, j - i), 0, false, line, col});
                i = j;
                continue;
            }
            if (std::isdigit((unsigned char)c) || (c == '.' && i + 1 < s.size() && std::isdigit((unsigned char)s[i + 1]))) {
                size_t j = i;
                bool integer = true;
                while (j < s.size() && std::isdigit((unsigned char)s[j])) ++j;
                if (j < s.size() && s[j] == '.') { integer = false; ++j; while (j < s.size() && std::isdigit((unsigned char)s[j])) ++j; }
                if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
                    integer = false;
                    ++j;
                    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
                    if (j >= s.size() || !std::isdigit((unsigned char)s[j])) error(line, int(j) + 1, "malformed number exponent");
                    while (j < s.size() && std::isdigit((unsigned char)s[j])) ++j;
                }
                Token t{Tok::number, s.substr(i, j - i), 0, integer, line, col};
                t.number = std::stod(t.text);
                out_.push_back(t);
                i = j;
                continue;
            }
            if (c == '"') {
                size_t close = s.find('"', i + 1);
                if (close == std::string::npos) error(line, col, "unterminated string");
                out_.push_back({Tok::string, s.substr(i + 1, close - i - 1), 0, false, line, col});
                i = close + 1;
                continue;
            }
            static const char* two[] = {"==", "!=", "<=", ">="};
            bool matched = false;
            for (auto op : two) {
                if (s.compare(i, 2, op) == 0) {
                    out_.push_back({Tok::op, op, 0, false, line, col});
                    i += 2;
                    matched = true;
                    break;
                }
            }
            if (matched) continue;
            if (std::string("+-*/%()[],:=<>?|").find(c) != std::string::npos) {
                out_.push_back({Tok::op, std::string(1, c), 0, false, line, col});
                ++i;
                continue;
            }
            error(line, col, fmt::format("unexpected character '{}'", c));
        }
    }

    std::string file_;
    const std::string& src_;
    std::vector<Token> out_;
};

class Parser {
public:
    Parser(std::string file, std::vector<Token> toks) : file_(std::move(file)), toks_(std::move(toks)) {}

    Program parse_program() {
        Program p;
        p.file = file_;
        skip_newlines();
        expect_name("arch");
        p.arch = expect_ident("an architecture name after 'arch'");
        expect_name("for");
        p.hf_architectures.push_back(expect_ident("a Hugging Face architecture name"));
        while (accept_op(",")) p.hf_architectures.push_back(expect_ident("a Hugging Face architecture name"));
        expect(Tok::newline, "end of line");
        while (!at(Tok::end)) {
            skip_newlines();
            if (at(Tok::end)) break;
            p.stmts.push_back(parse_stmt());
        }
        return p;
    }

private:
    const Token& cur() const { return toks_[i_]; }
    bool at(Tok k) const { return cur().kind == k; }
    bool at_op(const char* op) const { return cur().kind == Tok::op && cur().text == op; }
    bool at_name(const char* n) const { return cur().kind == Tok::name && cur().text == n; }
    SourceLoc loc() const { return {file_, cur().line, cur().col}; }

    [[noreturn]] void error(const std::string& msg) const {
        const Token& t = cur();
        std::string found = t.kind == Tok::newline ? "end of line"
                          : t.kind == Tok::end     ? "end of file"
                          : t.kind == Tok::indent  ? "an indented block"
                          : t.kind == Tok::dedent  ? "the end of a block"
                                                   : "'" + t.text + "'";
        fail("{}:{}:{}: expected {}, found {}", file_, t.line, t.col, msg, found);
    }

    void skip_newlines() { while (at(Tok::newline)) ++i_; }
    void expect(Tok k, const char* what) { if (!at(k)) error(what); ++i_; }
    bool accept_op(const char* op) { if (at_op(op)) { ++i_; return true; } return false; }
    void expect_op(const char* op) { if (!accept_op(op)) error(fmt::format("'{}'", op)); }
    void expect_name(const char* n) { if (!at_name(n)) error(fmt::format("'{}'", n)); ++i_; }
    std::string expect_ident(const char* what) {
        if (!at(Tok::name) || is_keyword(cur().text)) error(what);
        return toks_[i_++].text;
    }

    std::vector<StmtPtr> parse_block() {
        expect_op(":");
        expect(Tok::newline, "end of line after ':'");
        skip_newlines();
        expect(Tok::indent, "an indented block");
        std::vector<StmtPtr> body;
        while (!at(Tok::dedent) && !at(Tok::end)) {
            body.push_back(parse_stmt());
            skip_newlines();
        }
        if (at(Tok::dedent)) ++i_;
        return body;
    }

    StmtPtr parse_stmt() {
        auto s = std::make_unique<Stmt>();
        s->loc = loc();
        if (at_name("const")) {
            ++i_;
            s->kind = StmtKind::constant;
            s->targets.push_back(expect_ident("a constant name"));
            expect_op("=");
            s->value = parse_expr();
            expect(Tok::newline, "end of line");
        } else if (at_name("for")) {
            ++i_;
            s->kind = StmtKind::for_layers;
            s->loop_var = expect_ident("a loop variable");
            expect_name("in");
            s->value = parse_expr();
            if (at_name("at")) {
                ++i_;
                if (!at(Tok::name)) error("a weight-path prefix after 'at'");
                s->prefix = toks_[i_++].text;
            }
            s->body = parse_block();
        } else if (at_name("if")) {
            ++i_;
            s->kind = StmtKind::if_else;
            s->value = parse_expr();
            s->body = parse_block();
            skip_newlines();
            if (at_name("elif")) {
                // elif is an else holding one if.
                toks_[i_].text = "if";
                s->orelse.push_back(parse_stmt());
            } else if (at_name("else")) {
                ++i_;
                s->orelse = parse_block();
            }
        } else {
            s->kind = StmtKind::assign;
            s->targets.push_back(expect_ident("a statement (const, for, if, or an assignment)"));
            while (accept_op(",")) s->targets.push_back(expect_ident("a name to assign"));
            expect_op("=");
            s->value = parse_expr();
            expect(Tok::newline, "end of line");
        }
        return s;
    }

    ExprPtr make(ExprKind k, SourceLoc l) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->loc = std::move(l);
        return e;
    }

    ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, SourceLoc l) {
        auto e = make(ExprKind::binary, std::move(l));
        e->text = std::move(op);
        e->args.push_back(std::move(a));
        e->args.push_back(std::move(b));
        return e;
    }

    ExprPtr parse_expr() {  // ternary: c ? a : b
        auto l = loc();
        auto c = parse_fallback();
        if (accept_op("?")) {
            auto e = make(ExprKind::ternary, l);
            e->args.push_back(std::move(c));
            e->args.push_back(parse_fallback());
            expect_op(":");
            e->args.push_back(parse_expr());
            return e;
        }
        return c;
    }

    ExprPtr parse_fallback() {
        auto l = loc();
        auto a = parse_or();
        while (at_op("|")) {
            ++i_;
            auto e = make(ExprKind::fallback, l);
            e->args.push_back(std::move(a));
            e->args.push_back(parse_or());
            a = std::move(e);
        }
        return a;
    }

    ExprPtr parse_or() {
        auto l = loc();
        auto a = parse_and();
        while (at_name("or")) { ++i_; a = binary("or", std::move(a), parse_and(), l); }
        return a;
    }

    ExprPtr parse_and() {
        auto l = loc();
        auto a = parse_not();
        while (at_name("and")) { ++i_; a = binary("and", std::move(a), parse_not(), l); }
        return a;
    }

    ExprPtr parse_not() {
        if (at_name("not")) {
            auto e = make(ExprKind::unary, loc());
            ++i_;
            e->text = "not";
            e->args.push_back(parse_not());
            return e;
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        auto l = loc();
        auto a = parse_sum();
        for (;;) {
            if (at(Tok::op) && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
                std::string op = toks_[i_++].text;
                a = binary(op, std::move(a), parse_sum(), l);
            } else if (at_name("in")) {
                ++i_;
                a = binary("in", std::move(a), parse_sum(), l);
            } else {
                return a;
            }
        }
    }

    ExprPtr parse_sum() {
        auto l = loc();
        auto a = parse_product();
        while (at_op("+") || at_op("-")) {
            std::string op = toks_[i_++].text;
            a = binary(op, std::move(a), parse_product(), l);
        }
        return a;
    }

    ExprPtr parse_product() {
        auto l = loc();
        auto a = parse_unary();
        while (at_op("*") || at_op("/") || at_op("%")) {
            std::string op = toks_[i_++].text;
            a = binary(op, std::move(a), parse_unary(), l);
        }
        return a;
    }

    ExprPtr parse_unary() {
        if (at_op("-")) {
            auto e = make(ExprKind::unary, loc());
            ++i_;
            e->text = "-";
            e->args.push_back(parse_unary());
            return e;
        }
        return parse_postfix();
    }

    ExprPtr parse_postfix() {
        auto e = parse_primary();
        // `xs[i]`: an item of a compile-time list, e.g. layer_types[l].
        while (at_op("[")) {
            auto ix = make(ExprKind::index, loc());
            ++i_;
            ix->args.push_back(std::move(e));
            ix->args.push_back(parse_expr());
            expect_op("]");
            e = std::move(ix);
        }
        // `expr : [d0, d1]` gives a producing call its output shape (the token dim is implicit).
        if (at_op(":") && toks_[i_ + 1].kind == Tok::op && toks_[i_ + 1].text == "[") {
            auto s = make(ExprKind::shaped, loc());
            ++i_;
            ++i_;
            s->args.push_back(std::move(e));
            if (!at_op("]")) {
                s->args.push_back(parse_expr());
                while (accept_op(",")) s->args.push_back(parse_expr());
            }
            expect_op("]");
            return s;
        }
        return e;
    }

    ExprPtr parse_primary() {
        auto l = loc();
        const Token& t = cur();
        switch (t.kind) {
            case Tok::number: {
                auto e = make(ExprKind::number, l);
                e->number = t.number;
                e->is_integer = t.is_integer;
                e->text = t.text;
                ++i_;
                return e;
            }
            case Tok::string: {
                auto e = make(ExprKind::string, l);
                e->text = t.text;
                ++i_;
                return e;
            }
            case Tok::name: {
                if (t.text == "true" || t.text == "false") {
                    auto e = make(ExprKind::boolean, l);
                    e->number = t.text == "true";
                    ++i_;
                    return e;
                }
                if (is_keyword(t.text)) error("an expression");
                std::string name = t.text;
                ++i_;
                if (at_op("(")) {
                    ++i_;
                    auto e = make(ExprKind::call, l);
                    e->text = name;
                    if (!at_op(")")) {
                        do {
                            if (at(Tok::name) && toks_[i_ + 1].kind == Tok::op && toks_[i_ + 1].text == "=") {
                                std::string key = toks_[i_].text;
                                i_ += 2;
                                e->kwargs.emplace_back(key, parse_expr());
                            } else {
                                if (!e->kwargs.empty()) error("a keyword argument (positional arguments come first)");
                                e->args.push_back(parse_expr());
                            }
                        } while (accept_op(","));
                    }
                    expect_op(")");
                    return e;
                }
                auto e = make(ExprKind::name, l);
                e->text = name;
                return e;
            }
            case Tok::op:
                if (t.text == "(") {
                    ++i_;
                    auto e = parse_expr();
                    expect_op(")");
                    return e;
                }
                if (t.text == "[") {
                    ++i_;
                    auto e = make(ExprKind::list, l);
                    if (!at_op("]")) {
                        e->args.push_back(parse_expr());
                        while (accept_op(",")) e->args.push_back(parse_expr());
                    }
                    expect_op("]");
                    return e;
                }
                break;
            default:
                break;
        }
        error("an expression");
    }

    std::string file_;
    std::vector<Token> toks_;
    size_t i_ = 0;
};

}  // namespace

Program parse(const std::string& file, const std::string& source) {
    Lexer lx(file, source);
    Parser p(file, lx.run());
    Program prog = p.parse_program();
    prog.source = source;
    return prog;
}

Program parse_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read architecture file {}", path);
    std::stringstream ss;
    ss << in.rdbuf();
    return parse(path, ss.str());
}

}  // namespace scr::dsl
