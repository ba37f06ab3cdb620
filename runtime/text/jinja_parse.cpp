// Jinja lexer and parser. Whitespace handling follows jinja2/lexer.py with trim_blocks=True,
// lstrip_blocks=True and keep_trailing_newline=False (transformers' settings); the expression
// grammar and precedence follow jinja2/parser.py.
#include <cstring>

#include "runtime/core/error.hpp"
#include "runtime/text/jinja_ast.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text::jinja {

namespace {

struct Token {
    enum class Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
    Type type;
    std::string text;
    int line;
    int64_t int_value = 0;
    double float_value = 0;
};

bool is_space_tab(char c) { return c == ' ' || c == '\t'; }
bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
public:
    Lexer(std::string source, std::string name) : src_(std::move(source)), name_(std::move(name)) {
        // Jinja normalizes newlines and drops one trailing newline.
        std::string s;
        s.reserve(src_.size());
        for (size_t i = 0; i < src_.size(); ++i) {
            if (src_[i] == '\r') {
                s.push_back('\n');
                if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
            } else {
                s.push_back(src_[i]);
            }
        }
        if (!s.empty() && s.back() == '\n') s.pop_back();
        src_.swap(s);
    }

    std::vector<Token> run() {
        bool strip_next_text = false;  // previous tag closed with '-'
        bool line_starting = true;
        while (pos_ < src_.size()) {
            size_t open = find_tag(pos_);
            std::string text = src_.substr(pos_, (open == std::string::npos ? src_.size() : open) - pos_);
            char kind = 0, mod = 0;
            if (open != std::string::npos) {
                kind = src_[open + 1];
                if (open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')) mod = src_[open + 2];
            }
            if (strip_next_text) {
                size_t k = 0;
                while (k < text.size() && is_ws(text[k])) ++k;
                text.erase(0, k);
            }
            if (mod == '-') {
                size_t k = text.size();
                while (k > 0 && is_ws(text[k - 1])) --k;
                text.resize(k);
            } else if (mod != '+' && (kind == '%' || kind == '#') && open != std::string::npos) {
                const size_t nl = text.rfind('\n');
                const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
                if (l_pos > 0 || line_starting) {
                    bool only_ws = l_pos < text.size();
                    for (size_t k = l_pos; k < text.size(); ++k) only_ws = only_ws && is_space_tab(text[k]);
                    if (only_ws) text.resize(l_pos);
                }
            }
            if (!text.empty()) tokens_.push_back({Token::Type::Text, text, line_});
            count_lines(pos_, open == std::string::npos ? src_.size() : open);
            if (open == std::string::npos) break;
            pos_ = open + 2 + (mod ? 1 : 0);
            strip_next_text = false;
            line_starting = false;
            if (kind == '#') {
                const size_t close = src_.find("#}", pos_);
                if (close == std::string::npos) fail("unterminated comment");
                count_lines(pos_, close);
                strip_next_text = close > pos_ && src_[close - 1] == '-';
                pos_ = close + 2;
                if (!strip_next_text && pos_ < src_.size() && src_[pos_] == '\n') {
                    ++pos_;
                    ++line_;
                    line_starting = true;
                }
                continue;
            }
            const bool block = kind == '%';
            tokens_.push_back({block ? Token::Type::BlockBegin : Token::Type::VarBegin, "", line_});
            const size_t first_token = tokens_.size();
            char close_mod = lex_expression(block);
            if (close_mod == '-') {
                strip_next_text = true;
            } else if (block && close_mod != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
                ++pos_;  // trim_blocks
                ++line_;
                line_starting = true;
            }
            // {% raw %}...{% endraw %}: the inside is text.
            if (block && tokens_.size() == first_token + 2 && tokens_[first_token].type == Token::Type::Name &&
                tokens_[first_token].text == "raw") {
                tokens_.resize(first_token - 1);
                lex_raw(strip_next_text);
                strip_next_text = false;
            }
        }
        tokens_.push_back({Token::Type::End, "", line_});
        return std::move(tokens_);
    }

private:
    [[noreturn]] void fail(const std::string& what) const { scr::fail("{}:{}: {}", name_, line_, what); }

    void count_lines(size_t a, size_t b) {
        for (size_t k = a; k < b && k < src_.size(); ++k)
            if (src_[k] == '\n') ++line_;
    }

    size_t find_tag(size_t from) const {
        size_t p = from;
        while ((p = src_.find('{', p)) != std::string::npos) {
            if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
            ++p;
        }
        return std::string::npos;
    }

    void lex_raw(bool strip_first) {
        // Find {% endraw %} allowing whitespace and -/+ modifiers.
        size_t p = pos_;
        while (true) {
            p = src_.find("{%", p);
            if (p == std::string::npos) fail("missing {% endraw %}");
            size_t q = p + 2;
            const bool strip_before = q < src_.size() && src_[q] == '-';
            if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
            while (q < src_.size() && is_ws(src_[q])) ++q;
            if (src_.compare(q, 6, "endraw") != 0) {
                p += 2;
                continue;
            }
            q += 6;
            while (q < src_.size() && is_ws(src_[q])) ++q;
            bool strip_after = false;
            if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) {
                strip_after = src_[q] == '-';
                ++q;
            }
            if (src_.compare(q, 2, "%}") != 0) {
                p += 2;
                continue;
            }
            std::string text = src_.substr(pos_, p - pos_);
            if (strip_first) {
                size_t k = 0;
                while (k < text.size() && is_ws(text[k])) ++k;
                text.erase(0, k);
            }
            if (strip_before) {
                size_t k = text.size();
                while (k > 0 && is_ws(text[k - 1])) --k;
                text.resize(k);
            }
            if (!text.empty()) tokens_.push_back({Token::Type::Text, text, line_});
            count_lines(pos_, q + 2);
            pos_ = q + 2;
            if (strip_after) {
                while (pos_ < src_.size() && is_ws(src_[pos_])) {
                    if (src_[pos_] == '\n') ++line_;
                    ++pos_;
                }
            } else if (pos_ < src_.size() && src_[pos_] == '\n') {
                ++pos_;
                ++line_;
            }
            return;
        }
    }

    // Lexes tokens up to the closing delimiter; returns its modifier ('-', '+' or 0).
    char lex_expression(bool block) {
        const char* close = block ? "%}" : "}}";
        while (true) {
            while (pos_ < src_.size() && is_ws(src_[pos_])) {
                if (src_[pos_] == '\n') ++line_;
                ++pos_;
            }
            if (pos_ >= src_.size()) fail(block ? "unterminated {% ... %}" : "unterminated {{ ... }}");
            const char c = src_[pos_];
            if ((c == '-' || c == '+') && src_.compare(pos_ + 1, 2, close) == 0) {
                pos_ += 3;
                tokens_.push_back({block ? Token::Type::BlockEnd : Token::Type::VarEnd, "", line_});
                return c;
            }
            if (src_.compare(pos_, 2, close) == 0) {
                pos_ += 2;
                tokens_.push_back({block ? Token::Type::BlockEnd : Token::Type::VarEnd, "", line_});
                return 0;
            }
            if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
                size_t e = pos_;
                while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
                tokens_.push_back({Token::Type::Name, src_.substr(pos_, e - pos_), line_});
                pos_ = e;
                continue;
            }
            if (std::isdigit(static_cast<unsigned char>(c))) {
                lex_number();
                continue;
            }
            if (c == '\'' || c == '"') {
                lex_string(c);
                continue;
            }
            static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
            bool matched = false;
            for (const char* op : ops2) {
                if (src_.compare(pos_, 2, op) == 0) {
                    tokens_.push_back({Token::Type::Op, op, line_});
                    pos_ += 2;
                    matched = true;
                    break;
                }
            }
            if (matched) continue;
            if (std::strchr("+-*/%~<>=()[]{},.:|", c) != nullptr) {
                tokens_.push_back({Token::Type::Op, std::string(1, c), line_});
                ++pos_;
                continue;
            }
            fail(std::string("unexpected character '") + c + "'");
        }
    }

    void lex_number() {
        size_t e = pos_;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
            is_float = true;
            ++e;
            while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
            size_t f = e + 1;
            if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
            if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
                is_float = true;
                e = f;
                while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
            }
        }
        std::string text;
        for (size_t k = pos_; k < e; ++k)
            if (src_[k] != '_') text.push_back(src_[k]);
        Token t{is_float ? Token::Type::Float : Token::Type::Int, text, line_};
        try {
            if (is_float) t.float_value = std::stod(text);
            else t.int_value = std::stoll(text);
        } catch (const std::exception&) {
            fail("number out of range: " + text);
        }
        tokens_.push_back(t);
        pos_ = e;
    }

    // Python string literal escapes (jinja2 decodes them with unicode-escape).
    void lex_string(char quote) {
        std::string out;
        size_t p = pos_ + 1;
        const int start_line = line_;
        while (true) {
            if (p >= src_.size()) fail("unterminated string literal");
            const char c = src_[p];
            if (c == quote) {
                ++p;
                break;
            }
            if (c == '\n') ++line_;
            if (c != '\\') {
                out.push_back(c);
                ++p;
                continue;
            }
            if (p + 1 >= src_.size()) fail("unterminated string literal");
            const char e = src_[p + 1];
            p += 2;
            auto hex = [&](int n) -> char32_t {
                char32_t v = 0;
                for (int k = 0; k < n; ++k) {
                    if (p >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p])))
                        fail("bad escape in string literal");
                    const char h = src_[p++];
                    v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
                }
                return v;
            };
            switch (e) {
                case 'n': out.push_back('\n'); break;
                case 't': out.push_back('\t'); break;
                case 'r': out.push_back('\r'); break;
                case '\\': out.push_back('\\'); break;
                case '\'': out.push_back('\''); break;
                case '"': out.push_back('"'); break;
                case 'a': out.push_back('\a'); break;
                case 'b': out.push_back('\b'); break;
                case 'f': out.push_back('\f'); break;
                case 'v': out.push_back('\v'); break;
                case '0': out.push_back('\0'); break;
                case '\n': ++line_; break;  // line continuation
                case 'x': utf8::append(out, hex(2)); break;
                case 'u': utf8::append(out, hex(4)); break;
                case 'U': utf8::append(out, hex(8)); break;
                default:
                    out.push_back('\\');
                    out.push_back(e);
            }
        }
        tokens_.push_back({Token::Type::String, out, start_line});
        pos_ = p;
    }

    std::string src_;
    std::string name_;
    size_t pos_ = 0;
    int line_ = 1;
    std::vector<Token> tokens_;
};

// ---- Parser ---------------------------------------------------------------------------------------

class Parser {
public:
    Parser(std::vector<Token> tokens, std::string name) : t_(std::move(tokens)), name_(std::move(name)) {}

    // Bounds recursion so hostile templates fail cleanly instead of overflowing the stack.
    static constexpr int kMaxDepth = 200;
    struct DepthGuard {
        Parser& p;
        DepthGuard(Parser& parser, int line) : p(parser) {
            if (++p.depth_ > kMaxDepth) p.fail(line, "template nesting is too deep");
        }
        ~DepthGuard() { --p.depth_; }
    };

    std::unique_ptr<Node> parse() {
        auto root = std::make_unique<Node>(Node::Type::Root, 1);
        std::string end = parse_body(root->body, {});
        if (!end.empty()) fail(peek().line, "unexpected '" + end + "'");
        return root;
    }

private:
    [[noreturn]] void fail(int line, const std::string& what) const { scr::fail("{}:{}: {}", name_, line, what); }

    const Token& peek(size_t k = 0) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
    const Token& next() { return t_[std::min(pos_++, t_.size() - 1)]; }
    bool is_op(const char* op, size_t k = 0) const { return peek(k).type == Token::Type::Op && peek(k).text == op; }
    bool is_name(const char* n, size_t k = 0) const { return peek(k).type == Token::Type::Name && peek(k).text == n; }
    bool skip_op(const char* op) {
        if (!is_op(op)) return false;
        ++pos_;
        return true;
    }
    bool skip_name(const char* n) {
        if (!is_name(n)) return false;
        ++pos_;
        return true;
    }
    void expect_op(const char* op) {
        if (!skip_op(op)) fail(peek().line, std::string("expected '") + op + "', found " + describe(peek()));
    }
    std::string expect_name() {
        if (peek().type != Token::Type::Name) fail(peek().line, "expected a name, found " + describe(peek()));
        return next().text;
    }
    void expect_block_end() {
        if (peek().type != Token::Type::BlockEnd) fail(peek().line, "expected '%}', found " + describe(peek()));
        ++pos_;
    }
    static std::string describe(const Token& t) {
        switch (t.type) {
            case Token::Type::End: return "end of template";
            case Token::Type::BlockEnd: return "'%}'";
            case Token::Type::VarEnd: return "'}}'";
            case Token::Type::Text: return "text";
            default: return "'" + t.text + "'";
        }
    }

    // Parses nodes until a block tag whose keyword is in `ends`; returns that keyword (its
    // block-begin and keyword are consumed) or "" at end of input.
    std::string parse_body(Body& body, std::initializer_list<const char*> ends) {
        while (true) {
            const Token& tok = peek();
            if (tok.type == Token::Type::End) return "";
            if (tok.type == Token::Type::Text) {
                auto n = std::make_unique<Node>(Node::Type::Text, tok.line);
                n->text = tok.text;
                body.push_back(std::move(n));
                ++pos_;
                continue;
            }
            if (tok.type == Token::Type::VarBegin) {
                ++pos_;
                auto n = std::make_unique<Node>(Node::Type::Output, tok.line);
                n->expr = parse_expression();
                if (peek().type != Token::Type::VarEnd) fail(peek().line, "expected '}}', found " + describe(peek()));
                ++pos_;
                body.push_back(std::move(n));
                continue;
            }
            if (tok.type != Token::Type::BlockBegin) fail(tok.line, "unexpected " + describe(tok));
            const Token& kw = peek(1);
            if (kw.type != Token::Type::Name) fail(kw.line, "expected a statement name after '{%'");
            for (const char* e : ends) {
                if (kw.text == e) {
                    pos_ += 2;
                    return kw.text;
                }
            }
            pos_ += 2;
            body.push_back(parse_statement(kw.text, kw.line));
        }
    }

    std::string parse_body_expect(Body& body, std::initializer_list<const char*> ends, const char* what, int line) {
        std::string end = parse_body(body, ends);
        if (end.empty()) fail(line, std::string("unclosed '") + what + "' block (missing end tag)");
        return end;
    }

    std::unique_ptr<Node> parse_statement(const std::string& kw, int line) {
        DepthGuard guard(*this, line);
        if (kw == "if") return parse_if(line);
        if (kw == "for") return parse_for(line);
        if (kw == "set") return parse_set(line);
        if (kw == "macro") return parse_macro(line);
        if (kw == "call") return parse_call_block(line);
        if (kw == "filter") return parse_filter_block(line);
        if (kw == "with") return parse_with(line);
        if (kw == "break" || kw == "continue") {
            expect_block_end();
            return std::make_unique<Node>(kw == "break" ? Node::Type::Break : Node::Type::Continue, line);
        }
        if (kw == "generation") {
            // transformers' {% generation %} marks assistant text; it renders its body unchanged.
            expect_block_end();
            auto n = std::make_unique<Node>(Node::Type::With, line);
            parse_body_expect(n->body, {"endgeneration"}, "generation", line);
            expect_block_end();
            return n;
        }
        if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else")
            fail(line, "unexpected '{% " + kw + " %}' with no open block it could close");
        fail(line, "unsupported template statement '{% " + kw + " %}'");
    }

    std::unique_ptr<Node> parse_if(int line) {
        auto n = std::make_unique<Node>(Node::Type::If, line);
        ExprPtr cond = parse_expression();
        expect_block_end();
        while (true) {
            Body body;
            const std::string end = parse_body_expect(body, {"elif", "else", "endif"}, "if", line);
            n->branches.emplace_back(std::move(cond), std::move(body));
            if (end == "elif") {
                cond = parse_expression();
                expect_block_end();
                continue;
            }
            if (end == "else") {
                expect_block_end();
                parse_body_expect(n->else_body, {"endif"}, "if", line);
            }
            expect_block_end();
            return n;
        }
    }

    void parse_targets(std::vector<std::string>& targets) {
        const bool paren = skip_op("(");
        do {
            targets.push_back(expect_name());
        } while (skip_op(","));
        if (paren) expect_op(")");
    }

    std::unique_ptr<Node> parse_for(int line) {
        auto n = std::make_unique<Node>(Node::Type::For, line);
        parse_targets(n->targets);
        if (!skip_name("in")) fail(peek().line, "expected 'in' in for loop");
        n->expr = parse_expression(/*with_condexpr=*/false);
        if (skip_name("if")) n->cond = parse_expression(false);
        if (is_name("recursive")) fail(line, "unsupported: recursive for loops");
        expect_block_end();
        const std::string end = parse_body_expect(n->body, {"else", "endfor"}, "for", line);
        if (end == "else") {
            expect_block_end();
            parse_body_expect(n->else_body, {"endfor"}, "for", line);
        }
        expect_block_end();
        return n;
    }

    std::unique_ptr<Node> parse_set(int line) {
        auto n = std::make_unique<Node>(Node::Type::Set, line);
        n->targets.push_back(expect_name());
        if (skip_op(".")) {
            n->attr = expect_name();
        } else {
            while (skip_op(",")) n->targets.push_back(expect_name());
        }
        if (peek().type == Token::Type::BlockEnd || is_op("|")) {
            if (!n->attr.empty() || n->targets.size() != 1) fail(line, "block set takes a single name");
            n->type = Node::Type::SetBlock;
            if (is_op("|")) n->expr = parse_filter_chain_on_body(line);
            expect_block_end();
            parse_body_expect(n->body, {"endset"}, "set", line);
            expect_block_end();
            return n;
        }
        expect_op("=");
        n->expr = parse_tuple_or_expression();
        expect_block_end();
        return n;
    }

    void parse_params(Node& n) {
        expect_op("(");
        if (!skip_op(")")) {
            do {
                n.targets.push_back(expect_name());
                n.defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
            } while (skip_op(","));
            expect_op(")");
        }
    }

    std::unique_ptr<Node> parse_macro(int line) {
        auto n = std::make_unique<Node>(Node::Type::Macro, line);
        n->text = expect_name();
        parse_params(*n);
        expect_block_end();
        parse_body_expect(n->body, {"endmacro"}, "macro", line);
        if (peek().type == Token::Type::Name) ++pos_;  // {% endmacro name %}
        expect_block_end();
        return n;
    }

    std::unique_ptr<Node> parse_call_block(int line) {
        auto n = std::make_unique<Node>(Node::Type::CallBlock, line);
        if (is_op("(")) parse_params(*n);
        n->expr = parse_expression();
        if (n->expr->type != Expr::Type::Call) fail(line, "{% call %} expects a macro call");
        expect_block_end();
        parse_body_expect(n->body, {"endcall"}, "call", line);
        expect_block_end();
        return n;
    }

    // "| f(args) | g" applied to the rendered body, which the evaluator binds to __body__.
    ExprPtr parse_filter_chain_on_body(int line) {
        ExprPtr e = std::make_unique<Expr>(Expr::Type::Name, line);
        e->name = "__body__";
        skip_op("|");
        e = parse_filter(std::move(e));
        while (skip_op("|")) e = parse_filter(std::move(e));
        return e;
    }

    std::unique_ptr<Node> parse_filter_block(int line) {
        auto n = std::make_unique<Node>(Node::Type::FilterBlock, line);
        n->expr = parse_filter_chain_on_body(line);
        expect_block_end();
        parse_body_expect(n->body, {"endfilter"}, "filter", line);
        expect_block_end();
        return n;
    }

    std::unique_ptr<Node> parse_with(int line) {
        auto n = std::make_unique<Node>(Node::Type::With, line);
        while (peek().type != Token::Type::BlockEnd) {
            if (!n->targets.empty()) expect_op(",");
            n->targets.push_back(expect_name());
            expect_op("=");
            n->defaults.push_back(parse_expression());
        }
        expect_block_end();
        parse_body_expect(n->body, {"endwith"}, "with", line);
        expect_block_end();
        return n;
    }

    // ---- expressions (jinja2/parser.py precedence) ----

    ExprPtr make(Expr::Type t, int line) { return std::make_unique<Expr>(t, line); }

    ExprPtr parse_tuple_or_expression() {
        const int line = peek().line;
        ExprPtr first = parse_expression();
        if (!is_op(",")) return first;
        auto tuple = make(Expr::Type::Tuple, line);
        tuple->args.push_back(std::move(first));
        while (skip_op(",")) {
            if (peek().type == Token::Type::BlockEnd || peek().type == Token::Type::VarEnd) break;
            tuple->args.push_back(parse_expression());
        }
        return tuple;
    }

    ExprPtr parse_expression(bool with_condexpr = true) {
        DepthGuard guard(*this, peek().line);
        ExprPtr e = parse_or();
        if (!with_condexpr) return e;
        while (is_name("if")) {
            const int line = next().line;
            auto c = make(Expr::Type::Cond, line);
            c->args.push_back(std::move(e));
            c->args.push_back(parse_or());
            c->args.push_back(skip_name("else") ? parse_expression() : nullptr);
            e = std::move(c);
        }
        return e;
    }

    ExprPtr parse_or() {
        ExprPtr e = parse_and();
        while (is_name("or")) {
            auto n = make(Expr::Type::Or, next().line);
            n->args.push_back(std::move(e));
            n->args.push_back(parse_and());
            e = std::move(n);
        }
        return e;
    }

    ExprPtr parse_and() {
        ExprPtr e = parse_not();
        while (is_name("and")) {
            auto n = make(Expr::Type::And, next().line);
            n->args.push_back(std::move(e));
            n->args.push_back(parse_not());
            e = std::move(n);
        }
        return e;
    }

    ExprPtr parse_not() {
        DepthGuard guard(*this, peek().line);
        if (is_name("not")) {
            auto n = make(Expr::Type::Not, next().line);
            n->args.push_back(parse_not());
            return n;
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        const int line = peek().line;
        ExprPtr e = parse_math1();
        ExprPtr cmp;
        while (true) {
            std::string op;
            if (peek().type == Token::Type::Op &&
                (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
                 peek().text == "<=" || peek().text == ">=")) {
                op = next().text;
            } else if (is_name("in")) {
                ++pos_;
                op = "in";
            } else if (is_name("not") && is_name("in", 1)) {
                pos_ += 2;
                op = "notin";
            } else {
                break;
            }
            if (!cmp) {
                cmp = make(Expr::Type::Compare, line);
                cmp->args.push_back(std::move(e));
            }
            cmp->ops.push_back(op);
            cmp->args.push_back(parse_math1());
        }
        return cmp ? std::move(cmp) : std::move(e);
    }

    ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
        auto n = make(Expr::Type::Binary, line);
        n->name = op;
        n->args.push_back(std::move(a));
        n->args.push_back(std::move(b));
        return n;
    }

    ExprPtr parse_math1() {
        ExprPtr e = parse_concat();
        while (is_op("+") || is_op("-")) {
            const Token& op = next();
            e = binary(op.text, std::move(e), parse_concat(), op.line);
        }
        return e;
    }

    ExprPtr parse_concat() {
        ExprPtr e = parse_math2();
        while (is_op("~")) {
            const int line = next().line;
            e = binary("~", std::move(e), parse_math2(), line);
        }
        return e;
    }

    ExprPtr parse_math2() {
        ExprPtr e = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const Token& op = next();
            e = binary(op.text, std::move(e), parse_pow(), op.line);
        }
        return e;
    }

    ExprPtr parse_pow() {
        ExprPtr e = parse_unary();
        while (is_op("**")) {
            const int line = next().line;
            e = binary("**", std::move(e), parse_unary(), line);
        }
        return e;
    }

    ExprPtr parse_unary(bool with_filter = true) {
        DepthGuard guard(*this, peek().line);
        ExprPtr e;
        if (is_op("-") || is_op("+")) {
            const Token& op = next();
            e = make(Expr::Type::Unary, op.line);
            e->name = op.text;
            e->args.push_back(parse_unary(false));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }

    ExprPtr parse_primary() {
        const Token& tok = peek();
        const int line = tok.line;
        switch (tok.type) {
            case Token::Type::Name: {
                ++pos_;
                const std::string& n = tok.text;
                if (n == "true" || n == "True") return literal(Value(true), line);
                if (n == "false" || n == "False") return literal(Value(false), line);
                if (n == "none" || n == "None") return literal(Value::none(), line);
                auto e = make(Expr::Type::Name, line);
                e->name = n;
                return e;
            }
            case Token::Type::String: {
                std::string s = next().text;
                while (peek().type == Token::Type::String) s += next().text;  // "a" "b"
                return literal(Value(std::move(s)), line);
            }
            case Token::Type::Int: return literal(Value(next().int_value), line);
            case Token::Type::Float: return literal(Value(next().float_value), line);
            case Token::Type::Op:
                if (tok.text == "(") {
                    ++pos_;
                    if (skip_op(")")) return make(Expr::Type::Tuple, line);
                    ExprPtr first = parse_expression();
                    if (skip_op(")")) return first;
                    auto tuple = make(Expr::Type::Tuple, line);
                    tuple->args.push_back(std::move(first));
                    while (skip_op(",")) {
                        if (is_op(")")) break;
                        tuple->args.push_back(parse_expression());
                    }
                    expect_op(")");
                    return tuple;
                }
                if (tok.text == "[") {
                    ++pos_;
                    auto list = make(Expr::Type::List, line);
                    while (!skip_op("]")) {
                        if (!list->args.empty()) {
                            expect_op(",");
                            if (skip_op("]")) break;
                        }
                        list->args.push_back(parse_expression());
                    }
                    return list;
                }
                if (tok.text == "{") {
                    ++pos_;
                    auto dict = make(Expr::Type::Dict, line);
                    while (!skip_op("}")) {
                        if (!dict->args.empty()) {
                            expect_op(",");
                            if (skip_op("}")) break;
                        }
                        dict->args.push_back(parse_expression());
                        expect_op(":");
                        dict->args.push_back(parse_expression());
                    }
                    return dict;
                }
                break;
            default: break;
        }
        fail(line, "unexpected " + describe(tok) + " in expression");
    }

    ExprPtr literal(Value v, int line) {
        auto e = make(Expr::Type::Literal, line);
        e->literal = std::move(v);
        return e;
    }

    void parse_call_args(Expr& call) {
        // After '(' : positional then keyword arguments.
        while (!skip_op(")")) {
            if (call.args.size() > 1 || !call.kw_names.empty()) {
                if (call.args.size() > 1 || !call.kw_names.empty()) expect_op(",");
                if (skip_op(")")) break;
            }
            if (is_op("*") || is_op("**")) fail(peek().line, "unsupported: *args / **kwargs in calls");
            if (peek().type == Token::Type::Name && is_op("=", 1)) {
                call.kw_names.push_back(next().text);
                ++pos_;
                call.args.push_back(parse_expression());
            } else {
                if (!call.kw_names.empty()) fail(peek().line, "positional argument after keyword argument");
                call.args.push_back(parse_expression());
            }
        }
    }

    ExprPtr parse_postfix(ExprPtr e) {
        while (true) {
            const int line = peek().line;
            if (skip_op(".")) {
                if (peek().type == Token::Type::Int) {
                    auto n = make(Expr::Type::GetItem, line);
                    n->args.push_back(std::move(e));
                    n->args.push_back(literal(Value(next().int_value), line));
                    e = std::move(n);
                    continue;
                }
                auto n = make(Expr::Type::GetAttr, line);
                n->name = expect_name();
                n->args.push_back(std::move(e));
                e = std::move(n);
            } else if (skip_op("[")) {
                e = parse_subscript(std::move(e), line);
            } else if (skip_op("(")) {
                auto n = make(Expr::Type::Call, line);
                n->args.push_back(std::move(e));
                parse_call_args(*n);
                e = std::move(n);
            } else {
                return e;
            }
        }
    }

    ExprPtr parse_subscript(ExprPtr obj, int line) {
        ExprPtr parts[3];
        int n_colons = 0;
        if (!is_op(":")) parts[0] = parse_expression();
        while (skip_op(":")) {
            ++n_colons;
            if (n_colons > 2) fail(line, "too many ':' in slice");
            if (!is_op(":") && !is_op("]")) parts[n_colons] = parse_expression();
        }
        expect_op("]");
        if (n_colons == 0) {
            if (!parts[0]) fail(line, "empty subscript");
            auto n = make(Expr::Type::GetItem, line);
            n->args.push_back(std::move(obj));
            n->args.push_back(std::move(parts[0]));
            return n;
        }
        auto n = make(Expr::Type::Slice, line);
        n->args.push_back(std::move(obj));
        for (auto& p : parts) n->args.push_back(std::move(p));
        return n;
    }

    ExprPtr parse_filter(ExprPtr input) {
        const int line = peek().line;
        auto f = make(Expr::Type::Filter, line);
        f->name = expect_name();
        while (skip_op(".")) f->name += "." + expect_name();
        if (!is_known_filter(f->name)) fail(line, "unsupported filter '" + f->name + "'");
        f->args.push_back(std::move(input));
        if (skip_op("(")) parse_call_args(*f);
        return f;
    }

    ExprPtr parse_filter_expr(ExprPtr e) {
        while (true) {
            if (skip_op("|")) {
                e = parse_filter(std::move(e));
            } else if (is_name("is")) {
                const int line = next().line;
                auto t = make(Expr::Type::Test, line);
                t->negated = skip_name("not");
                t->name = expect_name();
                if (!is_known_test(t->name)) fail(line, "unsupported test '" + t->name + "'");
                t->args.push_back(std::move(e));
                if (skip_op("(")) {
                    parse_call_args(*t);
                } else if ((peek().type == Token::Type::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                            !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")) ||
                           peek().type == Token::Type::String || peek().type == Token::Type::Int ||
                           peek().type == Token::Type::Float || is_op("[") || is_op("{")) {
                    // `x is divisibleby 3`, `x is sameas false`: one primary argument.
                    t->args.push_back(parse_postfix(parse_primary()));
                }
                e = std::move(t);
            } else {
                return e;
            }
        }
    }

    std::vector<Token> t_;
    std::string name_;
    size_t pos_ = 0;
    int depth_ = 0;
};

}  // namespace

std::unique_ptr<Node> parse_template(const std::string& source, const std::string& name) {
    Lexer lexer(source, name);
    Parser parser(lexer.run(), name);
    return parser.parse();
}

}  // namespace scr::text::jinja
