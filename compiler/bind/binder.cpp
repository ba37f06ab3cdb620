#include "compiler/bind/binder.hpp"
#include "compiler/quant/apply.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

#include "runtime/core/error.hpp"

namespace scr::bind {
namespace {

using dsl::Expr;
using dsl::ExprKind;
using dsl::SourceLoc;
using dsl::Stmt;
using dsl::StmtKind;
using nlohmann::json;

// A value during compile-time execution of the program.
struct Val {
    enum Kind { absent, number, boolean, string, list, act, tuple, path, tokens } kind = absent;
    double num = 0;
    bool is_int = false;
    std::string str;         // string / path text
    std::vector<Val> items;  // list / tuple
    int vid = -1;            // value id
    std::string absent_key;  // which config key was missing (for errors)

    static Val of_number(double d, bool integer) { Val v; v.kind = number; v.num = d; v.is_int = integer; return v; }
    static Val of_bool(bool b) { Val v; v.kind = boolean; v.num = b; return v; }
};

const char* kind_name(Val::Kind k) {
    switch (k) {
        case Val::absent: return "an absent config value";
        case Val::number: return "a number";
        case Val::boolean: return "a boolean";
        case Val::string: return "a string";
        case Val::list: return "a list";
        case Val::act: return "a tensor";
        case Val::tuple: return "a tuple";
        case Val::path: return "a weight path";
        case Val::tokens: return "the token ids";
    }
    return "?";
}

Val from_json(const json& j) {
    Val v;
    if (j.is_boolean()) return Val::of_bool(j.get<bool>());
    if (j.is_number_integer() || j.is_number_unsigned()) return Val::of_number(double(j.get<int64_t>()), true);
    if (j.is_number_float()) {
        double d = j.get<double>();
        return Val::of_number(d, false);
    }
    if (j.is_string()) { v.kind = Val::string; v.str = j.get<std::string>(); return v; }
    if (j.is_array()) {
        v.kind = Val::list;
        for (auto& e : j) v.items.push_back(from_json(e));
        return v;
    }
    return v;  // null / object: absent
}

std::string val_text(const Val& v) {
    switch (v.kind) {
        case Val::number: return v.is_int ? fmt::format("{}", int64_t(v.num)) : fmt::format("{}", v.num);
        case Val::boolean: return v.num ? "true" : "false";
        case Val::string: return "\"" + v.str + "\"";
        case Val::list: {
            std::string s = "[";
            for (size_t i = 0; i < v.items.size(); ++i) s += (i ? ", " : "") + val_text(v.items[i]);
            return s + "]";
        }
        default: return kind_name(v.kind);
    }
}

struct RopeParams {
    std::string type = "default";
    double theta = 10000;
    int rotary_dim = 0;
    std::vector<float> inv_freq;
    std::vector<float> long_inv_freq;  // longrope: used once a sequence is longer than long_after
    int long_after = 0;
    double mscale = 1.0;               // yarn / longrope attention factor (multiplies cos and sin)
};

class Executor {
public:
    Executor(const dsl::Program& prog, const json& config, const quant::Preset& preset, Bound& out)
        : prog_(prog), config_(config), preset_(preset), out_(out) {}

    void run() {
        for (auto& s : prog_.stmts) exec(*s);
        auto it = locals_.find("logits");
        if (it == locals_.end() || it->second.kind != Val::act)
            fail("{}: the program must assign the output tensor `logits`", prog_.file);
        auto& lv = g().values[it->second.vid];
        int64_t vocab = required_const("vocab", SourceLoc{prog_.file, 1, 1});
        if (lv.width() != vocab)
            fail("{}: `logits` has width {} but the vocabulary is {}", prog_.file, lv.width(), vocab);
        if (lv.rows != ir::Rows::logits)
            fail("{}: `logits` must be computed after the layer loop (on the logit rows)", prog_.file);
        g().output = it->second.vid;
    }

    // Reads a key from config.json and records it; absent or null -> Val::absent.
    Val config_value(const std::string& pointer_str) {
        json::json_pointer ptr(pointer_str);
        const json* j = config_.contains(ptr) ? &config_.at(ptr) : nullptr;
        record(pointer_str, j);
        if (!j || j->is_null()) {
            Val v;
            v.absent_key = pointer_str.substr(1);
            return v;
        }
        Val v = from_json(*j);
        if (v.kind == Val::absent) v.absent_key = pointer_str.substr(1);
        return v;
    }

    void record(const std::string& pointer, const json* j) {
        if (recorded_.count(pointer)) return;
        recorded_.insert(pointer);
        out_.keys.push_back({pointer, j ? j->dump() : ""});
    }

private:
    ir::Graph& g() { return out_.graph; }

    [[noreturn]] void err(const SourceLoc& loc, const std::string& msg) { fail("{}: {}", loc.str(), msg); }

    // ---- statements ------------------------------------------------------------------------------
    void exec(const Stmt& s) {
        switch (s.kind) {
            case StmtKind::constant: {
                const std::string& name = s.targets[0];
                if (consts_.count(name)) err(s.loc, fmt::format("constant `{}` is defined twice", name));
                in_const_ = true;
                Val v = eval(*s.value);
                in_const_ = false;
                if (v.kind == Val::absent)
                    err(s.loc, fmt::format("constant `{}`: config.json has no \"{}\" and no fallback was given (write `{} = {} | <default>`)",
                                           name, v.absent_key, name, v.absent_key));
                consts_[name] = v;
                out_.consts.emplace_back(name, val_text(v));
                break;
            }
            case StmtKind::assign: {
                current_src_ = source_line(s.loc.line);
                Val v = eval(*s.value);
                if (s.targets.size() == 1) {
                    bind_local(s, s.targets[0], v);
                } else {
                    if (v.kind != Val::tuple || v.items.size() != s.targets.size())
                        err(s.loc, fmt::format("{} names on the left but the right side gives {}", s.targets.size(),
                                               v.kind == Val::tuple ? std::to_string(v.items.size()) + " values" : std::string("one value")));
                    for (size_t i = 0; i < s.targets.size(); ++i) bind_local(s, s.targets[i], v.items[i]);
                }
                break;
            }
            case StmtKind::for_layers: {
                if (in_loop_) err(s.loc, "layer loops cannot be nested");
                Val n = eval(*s.value);
                if (n.kind != Val::number || !n.is_int || n.num < 1)
                    err(s.value->loc, "a layer loop needs a positive integer count");
                in_loop_ = true;
                for (int64_t l = 0; l < int64_t(n.num); ++l) {
                    consts_[s.loop_var] = Val::of_number(double(l), true);
                    layer_ = int(l);
                    prefix_ = s.prefix.empty() ? "" : substitute(s.prefix, s.loc) + ".";
                    for (auto& b : s.body) exec(*b);
                }
                consts_.erase(s.loop_var);
                in_loop_ = false;
                layer_ = -1;
                prefix_.clear();
                head_ = true;  // statements after the layer loop run on the logit rows only
                break;
            }
            case StmtKind::if_else: {
                Val c = eval(*s.value);
                if (c.kind != Val::boolean) err(s.value->loc, fmt::format("an `if` needs a boolean, got {}", kind_name(c.kind)));
                for (auto& b : (c.num ? s.body : s.orelse)) exec(*b);
                break;
            }
        }
    }

    void bind_local(const Stmt& s, const std::string& name, const Val& v) {
        if (consts_.count(name)) err(s.loc, fmt::format("`{}` is a constant and cannot be reassigned", name));
        if (v.kind == Val::act && g().values[v.vid].name.empty()) g().values[v.vid].name = name;
        locals_[name] = v;
    }

    std::string source_line(int line) const {
        size_t pos = 0;
        for (int i = 1; i < line && pos != std::string::npos; ++i) pos = prog_.source.find('\n', pos) + 1;
        size_t end = prog_.source.find('\n', pos);
        std::string s = prog_.source.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        size_t b = s.find_first_not_of(' ');
        return b == std::string::npos ? "" : s.substr(b);
    }

    // Replaces {name} in a weight path with the integer value of that constant; unknown names stay.
    std::string substitute(const std::string& path, const SourceLoc& loc) {
        std::string out;
        for (size_t i = 0; i < path.size(); ++i) {
            if (path[i] == '{') {
                size_t close = path.find('}', i);
                std::string name = path.substr(i + 1, close - i - 1);
                auto it = consts_.find(name);
                if (it != consts_.end()) {
                    if (it->second.kind != Val::number || !it->second.is_int)
                        err(loc, fmt::format("`{{{}}}` in a weight path must be an integer", name));
                    out += std::to_string(int64_t(it->second.num));
                } else {
                    out += path.substr(i, close - i + 1);
                }
                i = close;
            } else {
                out += path[i];
            }
        }
        return out;
    }

    // ---- expressions -----------------------------------------------------------------------------
    Val eval(const Expr& e, const std::vector<int64_t>* shape = nullptr) {
        switch (e.kind) {
            case ExprKind::number: return Val::of_number(e.number, e.is_integer);
            case ExprKind::boolean: return Val::of_bool(e.number != 0);
            case ExprKind::string: { Val v; v.kind = Val::string; v.str = e.text; return v; }
            case ExprKind::list: {
                Val v;
                v.kind = Val::list;
                for (auto& a : e.args) v.items.push_back(eval(*a));
                return v;
            }
            case ExprKind::name: return eval_name(e);
            case ExprKind::fallback: {
                Val a = eval(*e.args[0]);
                return a.kind == Val::absent ? eval(*e.args[1]) : a;
            }
            case ExprKind::ternary: {
                Val c = eval(*e.args[0]);
                if (c.kind != Val::boolean) err(e.loc, fmt::format("`?` needs a boolean condition, got {}", kind_name(c.kind)));
                return eval(*e.args[c.num ? 1 : 2], shape);
            }
            case ExprKind::unary: {
                Val a = eval(*e.args[0]);
                if (e.text == "not") {
                    if (a.kind != Val::boolean) err(e.loc, "`not` needs a boolean");
                    return Val::of_bool(!a.num);
                }
                if (a.kind != Val::number) err(e.loc, "unary `-` needs a number");
                return Val::of_number(-a.num, a.is_int);
            }
            case ExprKind::binary: return eval_binary(e);
            case ExprKind::shaped: {
                std::vector<int64_t> dims;
                for (size_t i = 1; i < e.args.size(); ++i) {
                    Val d = eval(*e.args[i]);
                    if (d.kind != Val::number || !d.is_int || d.num < 1)
                        err(e.args[i]->loc, "a shape dimension must be a positive integer");
                    dims.push_back(int64_t(d.num));
                }
                if (e.args[0]->kind != ExprKind::call && e.args[0]->kind != ExprKind::ternary)
                    err(e.loc, "a shape annotation `: [..]` applies to an op call");
                return eval(*e.args[0], &dims);
            }
            case ExprKind::call: return eval_call(e, shape);
            case ExprKind::index: {
                Val xs = eval(*e.args[0]), i = eval(*e.args[1]);
                if (xs.kind != Val::list) err(e.loc, fmt::format("`[]` needs a list on the left, got {}", kind_name(xs.kind)));
                if (i.kind != Val::number || !i.is_int || i.num < 0 || i.num >= double(xs.items.size()))
                    err(e.args[1]->loc, fmt::format("index {} is outside the list of {} items", val_text(i), xs.items.size()));
                return xs.items[size_t(i.num)];
            }
        }
        err(e.loc, "unsupported expression");
    }

    Val eval_name(const Expr& e) {
        const std::string& n = e.text;
        if (auto it = locals_.find(n); it != locals_.end()) return it->second;
        if (auto it = consts_.find(n); it != consts_.end()) return it->second;
        if (n == "tokens") { Val v; v.kind = Val::tokens; return v; }
        if (in_const_) {
            if (n.find('.') != std::string::npos) {
                // nested config key: a.b -> /a/b
                std::string ptr;
                size_t start = 0;
                while (start <= n.size()) {
                    size_t dot = n.find('.', start);
                    ptr += "/" + n.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
                    if (dot == std::string::npos) break;
                    start = dot + 1;
                }
                return config_value(ptr);
            }
            return config_value("/" + n);
        }
        Val v;
        v.kind = Val::path;
        v.str = prefix_ + substitute(n, e.loc);
        return v;
    }

    static bool truthy_num(const Val& v) { return v.kind == Val::number; }

    Val eval_binary(const Expr& e) {
        const std::string& op = e.text;
        if (op == "and" || op == "or") {
            Val a = eval(*e.args[0]);
            if (a.kind != Val::boolean) err(e.loc, fmt::format("`{}` needs booleans", op));
            if (op == "and" && !a.num) return a;
            if (op == "or" && a.num) return a;
            Val b = eval(*e.args[1]);
            if (b.kind != Val::boolean) err(e.loc, fmt::format("`{}` needs booleans", op));
            return b;
        }
        Val a = eval(*e.args[0]);
        Val b = eval(*e.args[1]);
        if (op == "in") {
            if (b.kind != Val::list) err(e.loc, "`in` needs a list on the right");
            for (auto& it : b.items)
                if (it.kind == a.kind && it.num == a.num && it.str == a.str) return Val::of_bool(true);
            return Val::of_bool(false);
        }
        if (a.kind == Val::act || b.kind == Val::act) return tensor_binary(e, op, a, b);
        if (op == "==" || op == "!=") {
            bool eq = a.kind == b.kind && a.num == b.num && a.str == b.str;
            return Val::of_bool(op == "==" ? eq : !eq);
        }
        if (!truthy_num(a) || !truthy_num(b))
            err(e.loc, fmt::format("`{}` needs numbers, got {} and {}", op, kind_name(a.kind), kind_name(b.kind)));
        bool ints = a.is_int && b.is_int;
        if (op == "+") return Val::of_number(a.num + b.num, ints);
        if (op == "-") return Val::of_number(a.num - b.num, ints);
        if (op == "*") return Val::of_number(a.num * b.num, ints);
        if (op == "/") {
            if (b.num == 0) err(e.loc, "division by zero");
            if (ints) {
                if (int64_t(a.num) % int64_t(b.num) != 0)
                    err(e.loc, fmt::format("{} / {} is not an integer", int64_t(a.num), int64_t(b.num)));
                return Val::of_number(double(int64_t(a.num) / int64_t(b.num)), true);
            }
            return Val::of_number(a.num / b.num, false);
        }
        if (op == "%") {
            if (!ints || b.num == 0) err(e.loc, "`%` needs integers and a non-zero divisor");
            return Val::of_number(double(int64_t(a.num) % int64_t(b.num)), true);
        }
        if (op == "<") return Val::of_bool(a.num < b.num);
        if (op == "<=") return Val::of_bool(a.num <= b.num);
        if (op == ">") return Val::of_bool(a.num > b.num);
        if (op == ">=") return Val::of_bool(a.num >= b.num);
        err(e.loc, fmt::format("unknown operator `{}`", op));
    }

    // ---- graph building --------------------------------------------------------------------------
    int new_value(std::vector<int64_t> dims, ir::Rows rows) {
        ir::Value v;
        v.id = int(g().values.size());
        v.dims = std::move(dims);
        v.rows = rows;
        g().values.push_back(v);
        return v.id;
    }

    ir::Rows out_rows() const { return head_ ? ir::Rows::logits : ir::Rows::tokens; }

    // Inputs to head statements are gathered to the logit rows once.
    int input(const SourceLoc& loc, const Val& v, const char* what) {
        if (v.kind != Val::act) err(loc, fmt::format("{} must be a tensor, got {}", what, kind_name(v.kind)));
        int id = v.vid;
        if (head_ && g().values[id].rows == ir::Rows::tokens) {
            if (auto it = gathered_.find(id); it != gathered_.end()) return it->second;
            int out = new_value(g().values[id].dims, ir::Rows::logits);
            ir::Op op = make_op(ir::OpKind::gather_rows, loc);
            op.in = {id};
            op.out = {out};
            g().ops.push_back(op);
            gathered_[id] = out;
            return out;
        }
        return id;
    }

    ir::Op make_op(ir::OpKind k, const SourceLoc& loc) {
        ir::Op op;
        op.kind = k;
        op.layer = layer_;
        op.loc = loc;
        op.src = current_src_;
        return op;
    }

    Val act(int id) { Val v; v.kind = Val::act; v.vid = id; return v; }

    int tensor(const SourceLoc& loc, const std::string& name, std::vector<int64_t> shape, ir::TensorRole role,
               bool optional = false) {
        // By name: a tensor used twice (tied embeddings) is one entry. A map, as MoE models have
        // tens of thousands of expert tensors.
        if (auto it = tensor_index_.find(name); it != tensor_index_.end()) {
            auto& t = g().tensors[size_t(it->second)];
            if (t.shape != shape)
                err(loc, fmt::format("tensor {} is used with shape [{}] here but [{}] elsewhere", name,
                                     fmt::join(shape, ", "), fmt::join(t.shape, ", ")));
            return it->second;
        }
        ir::Tensor t;
        t.name = name;
        t.shape = std::move(shape);
        t.role = role;
        t.optional = optional;
        switch (role) {
            case ir::TensorRole::embedding: t.dtype = preset_.embedding; break;
            case ir::TensorRole::linear: t.dtype = preset_.linear; break;
            case ir::TensorRole::router: t.dtype = preset_.router; break;
            case ir::TensorRole::norm:
            case ir::TensorRole::bias: t.dtype = preset_.norm; break;
        }
        g().tensors.push_back(t);
        tensor_index_[name] = int(g().tensors.size() - 1);
        return int(g().tensors.size() - 1);
    }

    Val tensor_binary(const Expr& e, const std::string& op, const Val& a, const Val& b) {
        // tensor * number, number * tensor, tensor / number: one `scale` op with the factor as a constant.
        const bool a_num = a.kind == Val::number, b_num = b.kind == Val::number;
        if ((op == "*" && (a_num || b_num)) || (op == "/" && b_num)) {
            const Val& t = a_num ? b : a;
            double f = a_num ? a.num : b.num;
            if (op == "/") {
                if (f == 0) err(e.loc, "division of a tensor by zero");
                f = 1.0 / f;
            }
            int x = input(e.loc, t, "scaled operand");
            ir::Op o = make_op(ir::OpKind::scale, e.loc);
            o.in = {x};
            o.attr["factor"] = f;
            o.out = {new_value(g().values[x].dims, g().values[x].rows)};
            g().ops.push_back(o);
            return act(o.out[0]);
        }
        if (a.kind != Val::act || b.kind != Val::act)
            err(e.loc, fmt::format("`{}` between a tensor and {} is not supported", op,
                                   kind_name(a.kind == Val::act ? b.kind : a.kind)));
        if (op != "+" && op != "*") err(e.loc, fmt::format("tensor operator `{}` is not supported (use + or *)", op));
        int x = input(e.loc, a, "left operand"), y = input(e.loc, b, "right operand");
        auto& vx = g().values[x];
        auto& vy = g().values[y];
        if (vx.width() != vy.width())
            err(e.loc, fmt::format("`{}` of tensors of widths {} and {}", op, vx.width(), vy.width()));
        if (vx.rows != vy.rows) err(e.loc, "`+`/`*` of a token tensor and a logit-row tensor");
        ir::Op o = make_op(op == "+" ? ir::OpKind::add : ir::OpKind::mul, e.loc);
        o.in = {x, y};
        o.out = {new_value(vx.dims, vx.rows)};
        g().ops.push_back(o);
        return act(o.out[0]);
    }

    struct Args {
        const Expr& call;
        std::vector<Val> pos;
        std::map<std::string, Val> kw;
        std::set<std::string> used;
        const Val& at(size_t i, const char* what) const {
            if (i >= pos.size())
                fail("{}: {}() needs argument {} ({})", call.loc.str(), call.text, i + 1, what);
            return pos[i];
        }
        std::optional<Val> key(const std::string& k) {
            used.insert(k);
            auto it = kw.find(k);
            if (it == kw.end()) return std::nullopt;
            return it->second;
        }
    };

    int64_t int_arg(const SourceLoc& loc, const Val& v, const char* what) {
        if (v.kind != Val::number || !v.is_int) err(loc, fmt::format("{} must be an integer, got {}", what, val_text(v)));
        return int64_t(v.num);
    }

    double num_arg(const SourceLoc& loc, const Val& v, const char* what) {
        if (v.kind != Val::number) err(loc, fmt::format("{} must be a number, got {}", what, val_text(v)));
        return v.num;
    }

    bool bool_arg(const SourceLoc& loc, const Val& v, const char* what) {
        if (v.kind != Val::boolean) err(loc, fmt::format("{} must be true or false, got {}", what, val_text(v)));
        return v.num != 0;
    }

    std::string path_arg(const SourceLoc& loc, const Val& v, const char* what) {
        if (v.kind != Val::path) err(loc, fmt::format("{} must be a weight path, got {}", what, kind_name(v.kind)));
        return v.str;
    }

    int64_t required_const(const char* name, const SourceLoc& loc) {
        auto it = consts_.find(name);
        if (it == consts_.end() || it->second.kind != Val::number || !it->second.is_int)
            err(loc, fmt::format("this op needs the integer constant `{}` (every architecture defines hidden, vocab, layers)", name));
        return int64_t(it->second.num);
    }

    Val eval_call(const Expr& e, const std::vector<int64_t>* shape) {
        Args a{e, {}, {}, {}};
        for (auto& x : e.args) a.pos.push_back(eval(*x));
        for (auto& [k, x] : e.kwargs) a.kw[k] = eval(*x);
        Val r;
        const std::string& f = e.text;
        if (f == "len") {  // compile-time: the length of a list
            const Val& xs = a.at(0, "list");
            if (xs.kind != Val::list) err(e.loc, fmt::format("len() needs a list, got {}", kind_name(xs.kind)));
            return Val::of_number(double(xs.items.size()), true);
        }
        if (f == "sqrt" || f == "log") {  // compile-time math on config numbers
            const Val& x = a.at(0, "number");
            if (x.kind != Val::number || x.num <= 0 || (f == "sqrt" && x.num < 0))
                err(e.loc, fmt::format("{}() needs a positive number, got {}", f, val_text(x)));
            return Val::of_number(f == "sqrt" ? std::sqrt(x.num) : std::log(x.num), false);
        }
        if (f == "split") return op_split(a);
        if (f == "embed") r = op_embed(a);
        else if (f == "rmsnorm") r = op_rmsnorm(a);
        else if (f == "linear") r = op_linear(a, shape);
        else if (f == "silu") r = op_unary(a, ir::OpKind::silu);
        else if (f == "gelu_tanh") r = op_unary(a, ir::OpKind::gelu_tanh);
        else if (f == "softcap") r = op_softcap(a);
        else if (f == "rope") r = op_rope(a);
        else if (f == "attention") r = op_attention(a);
        else if (f == "moe") r = op_moe(a);
        else if (f == "mla") r = op_mla(a);
        else err(e.loc, fmt::format("unknown op `{}` (ops: embed, rmsnorm, linear, split, silu, gelu_tanh, softcap, rope, "
                                    "attention, mla, moe; compile-time: len, sqrt, log)", f));
        for (auto& [k, _] : a.kw)
            if (!a.used.count(k)) err(e.loc, fmt::format("{}() has no keyword argument `{}`", f, k));
        if (shape && f != "linear") {
            auto& v = g().values[r.vid];
            int64_t w = std::accumulate(shape->begin(), shape->end(), int64_t(1), std::multiplies<>());
            if (w != v.width()) err(e.loc, fmt::format("{}() produces width {} but the annotation says {}", f, v.width(), w));
            v.dims = *shape;
        }
        return r;
    }

    Val op_embed(Args& a) {
        const auto& loc = a.call.loc;
        if (a.at(0, "token ids").kind != Val::tokens) err(loc, "embed() takes `tokens` first");
        if (head_) err(loc, "embed() must come before the layer loop");
        std::string p = path_arg(loc, a.at(1, "embedding table"), "embed()'s table");
        int64_t vocab = required_const("vocab", loc), hidden = required_const("hidden", loc);
        ir::Op op = make_op(ir::OpKind::embed, loc);
        op.weights = {tensor(loc, p + ".weight", {vocab, hidden}, ir::TensorRole::embedding)};
        op.out = {new_value({hidden}, ir::Rows::tokens)};
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    Val op_rmsnorm(Args& a) {
        const auto& loc = a.call.loc;
        int x = input(loc, a.at(0, "input"), "rmsnorm()'s input");
        std::string p = path_arg(loc, a.at(1, "weight"), "rmsnorm()'s weight");
        double eps = num_arg(loc, a.at(2, "epsilon"), "rmsnorm()'s epsilon");
        // offset=1: the weight is stored as w - 1 (Gemma: x_normed * (1 + w)).
        double offset = 0;
        if (auto o = a.key("offset")) offset = num_arg(loc, *o, "rmsnorm()'s offset");
        if (offset != 0 && offset != 1) err(loc, fmt::format("rmsnorm(): offset must be 0 or 1, got {}", offset));
        auto dims = g().values[x].dims;
        ir::Op op = make_op(ir::OpKind::rmsnorm, loc);
        op.in = {x};
        op.weights = {tensor(loc, p + ".weight", {dims.back()}, ir::TensorRole::norm)};
        op.attr["eps"] = eps;
        op.attr["dim"] = double(dims.back());
        op.attr["offset"] = offset;
        op.out = {new_value(dims, g().values[x].rows)};
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    Val op_linear(Args& a, const std::vector<int64_t>* shape) {
        const auto& loc = a.call.loc;
        int x = input(loc, a.at(0, "input"), "linear()'s input");
        std::string p = path_arg(loc, a.at(1, "weight"), "linear()'s weight");
        if (!shape) err(loc, "linear() needs its output shape: write `linear(x, w) : [n]`");
        bool bias = false;
        if (auto b = a.key("bias")) bias = bool_arg(loc, *b, "linear()'s bias");
        int64_t n = std::accumulate(shape->begin(), shape->end(), int64_t(1), std::multiplies<>());
        int64_t k = g().values[x].width();
        ir::Op op = make_op(ir::OpKind::linear, loc);
        op.in = {x};
        // A table already used as the embedding keeps its role (tied lm_head).
        op.weights = {tensor(loc, p + ".weight", {n, k}, ir::TensorRole::linear)};
        op.weights.push_back(bias ? tensor(loc, p + ".bias", {n}, ir::TensorRole::bias) : -1);
        op.attr["n"] = double(n);
        op.attr["k"] = double(k);
        op.out = {new_value(*shape, g().values[x].rows)};
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    // silu(x), gelu_tanh(x): elementwise activations.
    Val op_unary(Args& a, ir::OpKind kind) {
        const auto& loc = a.call.loc;
        int x = input(loc, a.at(0, "input"), "the activation's input");
        ir::Op op = make_op(kind, loc);
        op.in = {x};
        op.out = {new_value(g().values[x].dims, g().values[x].rows)};
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    // softcap(x, c) = c * tanh(x / c) (Gemma 2's final logits).
    Val op_softcap(Args& a) {
        const auto& loc = a.call.loc;
        int x = input(loc, a.at(0, "input"), "softcap()'s input");
        double cap = num_arg(loc, a.at(1, "cap"), "softcap()'s cap");
        if (cap <= 0) err(loc, fmt::format("softcap(): cap {} must be > 0", cap));
        ir::Op op = make_op(ir::OpKind::softcap, loc);
        op.in = {x};
        op.attr["cap"] = cap;
        op.out = {new_value(g().values[x].dims, g().values[x].rows)};
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    // a, b, ... = split(x, [n_a, n_b, ...], dim=-1): consecutive pieces of one dim of x's per-row
    // shape (a fused qkv or gate_up projection). One `slice` op (a strided copy) per piece.
    Val op_split(Args& a) {
        const auto& loc = a.call.loc;
        int x = input(loc, a.at(0, "input"), "split()'s input");
        const Val& sizes = a.at(1, "list of sizes");
        if (sizes.kind != Val::list || sizes.items.empty()) err(loc, "split() needs a list of sizes");
        auto dims = g().values[x].dims;
        int64_t dim = int64_t(dims.size()) - 1;
        if (auto d = a.key("dim")) dim = int_arg(loc, *d, "split()'s dim");
        if (dim < 0) dim += int64_t(dims.size());
        if (dim < 0 || dim >= int64_t(dims.size()))
            err(loc, fmt::format("split(): dim is outside the input's {} dims", dims.size()));
        for (auto& [k, _] : a.kw)
            if (k != "dim") err(loc, fmt::format("split() has no keyword argument `{}`", k));
        int64_t outer = 1, inner = 1, total = 0;
        for (int64_t i = 0; i < dim; ++i) outer *= dims[size_t(i)];
        for (size_t i = size_t(dim) + 1; i < dims.size(); ++i) inner *= dims[i];
        Val out;
        out.kind = Val::tuple;
        for (auto& s : sizes.items) {
            int64_t n = int_arg(loc, s, "a split size");
            if (n < 1) err(loc, "split(): sizes must be positive");
            auto od = dims;
            od[size_t(dim)] = n;
            ir::Op op = make_op(ir::OpKind::slice, loc);
            op.in = {x};
            op.attr["outer"] = double(outer);                     // runs per row
            op.attr["stride"] = double(dims[size_t(dim)] * inner);  // floats between runs in the input
            op.attr["offset"] = double(total * inner);             // first float of the piece in a run
            op.attr["len"] = double(n * inner);                    // floats per run
            op.out = {new_value(od, g().values[x].rows)};
            g().ops.push_back(op);
            out.items.push_back(act(op.out[0]));
            total += n;
        }
        if (total != dims[size_t(dim)])
            err(loc, fmt::format("split(): sizes add up to {} but the dim has {}", total, dims[size_t(dim)]));
        return out;
    }

    // The rope parameter set, as transformers 5 standardizes it (modeling_rope_utils
    // standardize_rope_params): `rope_parameters` (one dict, or one per layer type when keyed by
    // "full_attention"/"sliding_attention"), else the legacy `rope_theta` + `rope_scaling`. Frequencies
    // are computed here once, as transformers computes them (float32 exponents).
    RopeParams rope_params(const SourceLoc& loc, int64_t head_dim, const std::string& layer_type) {
        RopeParams r;
        auto object_at = [&](const std::string& ptr) {
            json::json_pointer jp(ptr);
            return config_.contains(jp) && config_.at(jp).is_object() && !config_.at(jp).empty();
        };
        std::string base;  // JSON pointer of the parameter dict ("" when the config has none)
        bool legacy_local = false;
        if (object_at("/rope_parameters")) {
            base = "/rope_parameters";
            const auto& rp = config_.at(json::json_pointer(base));
            bool nested = rp.contains("full_attention") || rp.contains("sliding_attention");
            if (nested) {
                if (layer_type.empty())
                    err(loc, "rope(): config.json has rope_parameters per layer type; pass layer_type=\"full_attention\" or \"sliding_attention\"");
                if (!object_at(base + "/" + layer_type))
                    err(loc, fmt::format("rope(): config.json has no rope_parameters for layer type \"{}\"", layer_type));
                base += "/" + layer_type;
            }
            record("/rope_parameters", &rp);
        } else {
            record("/rope_parameters", nullptr);
            json::json_pointer sp("/rope_scaling");
            record("/rope_scaling", config_.contains(sp) ? &config_.at(sp) : nullptr);
            // Gemma 3's legacy configs: rope_scaling and rope_theta are the global layers'; local
            // layers use plain rope with rope_local_base_freq (transformers' Gemma3 conversion).
            legacy_local = layer_type == "sliding_attention";
            if (object_at("/rope_scaling") && !legacy_local) base = "/rope_scaling";
        }
        auto key = [&](const char* k) { return base.empty() ? Val{} : config_value(base + "/" + k); };
        auto number_or = [&](Val v, Val fallback, double dflt) {
            return v.kind == Val::number ? v.num : fallback.kind == Val::number ? fallback.num : dflt;
        };
        r.theta = legacy_local ? number_or(config_value("/rope_local_base_freq"), Val{}, 10000.0)
                               : number_or(key("rope_theta"), config_value("/rope_theta"), 10000.0);
        Val ty = key("rope_type");
        if (ty.kind != Val::string) ty = key("type");
        r.type = ty.kind == Val::string ? ty.str : "default";
        if (r.type == "su") r.type = "longrope";  // Phi-3's early name
        double factor_rot = number_or(key("partial_rotary_factor"), config_value("/partial_rotary_factor"), 1.0);
        r.rotary_dim = int(double(head_dim) * factor_rot);
        if (r.rotary_dim % 2 != 0 || r.rotary_dim < 2 || r.rotary_dim > head_dim)
            err(loc, fmt::format("rope(): rotary dimension {} (head_dim {} x partial_rotary_factor {}) must be even and within head_dim",
                                 r.rotary_dim, head_dim, factor_rot));
        const int dim = r.rotary_dim;
        // As transformers computes it: float32 exponent i/dim, then base ** exponent.
        std::vector<float> pos_freq(size_t(dim / 2));
        r.inv_freq.resize(dim / 2);
        for (int i = 0; i < dim / 2; ++i) {
            float expo = float(2 * i) / float(dim);
            pos_freq[size_t(i)] = float(std::pow(r.theta, double(expo)));
            r.inv_freq[i] = float(1.0 / std::pow(r.theta, double(expo)));
        }
        auto num = [&](const char* k, std::optional<double> dflt) {
            Val v = key(k);
            if (v.kind == Val::number) return v.num;
            if (!dflt) err(loc, fmt::format("rope(): rope type \"{}\" needs \"{}\" in config.json", r.type, k));
            return *dflt;
        };
        // Pretraining context of the scaled types: a top-level original_max_position_embeddings wins
        // (Phi-3 keeps it there), then the dict's, then max_position_embeddings.
        auto original_ctx = [&]() {
            Val top = config_value("/original_max_position_embeddings");
            if (top.kind == Val::number && base.find("/full_attention") == std::string::npos &&
                base.find("/sliding_attention") == std::string::npos)
                return top.num;
            return num("original_max_position_embeddings", double(out_.max_position));
        };
        if (r.type == "default") {
        } else if (r.type == "linear") {
            double f = num("factor", std::nullopt);
            for (auto& x : r.inv_freq) x = float(x / f);
        } else if (r.type == "llama3") {
            // transformers' _compute_llama3_parameters, evaluated once here.
            double factor = num("factor", std::nullopt), low = num("low_freq_factor", std::nullopt),
                   high = num("high_freq_factor", std::nullopt), old_ctx = original_ctx();
            double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
            for (auto& x : r.inv_freq) {
                double inv = x, wavelen = 2 * M_PI / inv;
                double scaled = wavelen > low_wavelen ? inv / factor : inv;
                bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
                if (medium) {
                    double smooth = (old_ctx / wavelen - low) / (high - low);
                    scaled = (1 - smooth) * scaled / factor + smooth * scaled;
                }
                x = float(scaled);
            }
        } else if (r.type == "yarn") {
            // transformers' _compute_yarn_parameters: blend interpolated and extrapolated frequencies
            // over a linear ramp between the correction dims; cos/sin scaled by the attention factor.
            double old_ctx = original_ctx();
            double factor = num("factor", double(out_.max_position) / old_ctx);
            Val af = key("attention_factor"), ms = key("mscale"), msa = key("mscale_all_dim");
            auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
            if (af.kind == Val::number) r.mscale = af.num;
            else if (ms.kind == Val::number && msa.kind == Val::number && ms.num != 0 && msa.num != 0)
                r.mscale = get_mscale(factor, ms.num) / get_mscale(factor, msa.num);
            else r.mscale = get_mscale(factor, 1.0);
            double beta_fast = num("beta_fast", 32.0), beta_slow = num("beta_slow", 1.0);
            if (beta_fast == 0) beta_fast = 32.0;
            if (beta_slow == 0) beta_slow = 1.0;
            Val tr = key("truncate");
            bool truncate = tr.kind == Val::boolean ? tr.num != 0 : true;
            auto correction_dim = [&](double rotations) {
                return (dim * std::log(old_ctx / (rotations * 2 * M_PI))) / (2 * std::log(r.theta));
            };
            double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
            if (truncate) { low = std::floor(low); high = std::ceil(high); }
            low = std::max(low, 0.0);
            high = std::min(high, double(dim - 1));
            if (low == high) high += 0.001;
            for (int i = 0; i < dim / 2; ++i) {
                float ramp = std::clamp(float((float(i) - float(low)) / float(high - low)), 0.0f, 1.0f);
                float extra = 1.0f - ramp;  // weight of the extrapolated (unscaled) frequency
                float interp = 1.0f / (float(factor) * pos_freq[size_t(i)]), extrap = 1.0f / pos_freq[size_t(i)];
                r.inv_freq[size_t(i)] = interp * (1.0f - extra) + extrap * extra;
            }
        } else if (r.type == "longrope") {
            // transformers' _compute_longrope_parameters: per-frequency divisors, short ones up to the
            // pretraining context and long ones beyond; cos/sin scaled by the attention factor.
            double old_ctx = original_ctx();
            double factor = num("factor", double(out_.max_position) / old_ctx);
            Val af = key("attention_factor");
            r.mscale = af.kind == Val::number ? af.num
                     : factor <= 1.0          ? 1.0
                                              : std::sqrt(1 + std::log(factor) / std::log(old_ctx));
            auto factors = [&](const char* k) {
                Val v = key(k);
                if (v.kind != Val::list || int(v.items.size()) != dim / 2)
                    err(loc, fmt::format("rope(): longrope needs \"{}\" as a list of {} numbers", k, dim / 2));
                std::vector<float> out;
                for (int i = 0; i < dim / 2; ++i) {
                    if (v.items[size_t(i)].kind != Val::number) err(loc, fmt::format("rope(): \"{}\" must hold numbers", k));
                    float expo = float(2 * i) / float(dim);
                    out.push_back(1.0f / (float(v.items[size_t(i)].num) * float(std::pow(r.theta, double(expo)))));
                }
                return out;
            };
            r.inv_freq = factors("short_factor");
            r.long_inv_freq = factors("long_factor");
            r.long_after = int(old_ctx);
        } else {
            err(loc, fmt::format("rope(): rope type \"{}\" is not supported yet (supported: default, linear, llama3, yarn, longrope)", r.type));
        }
        return r;
    }

    // rope(q, k [, layer_type=, interleaved=]): rotates the first rotary_dim dims of each head.
    // layer_type picks the per-layer-type parameters (Gemma 3's local/global bases); interleaved
    // rotates pairs (2i, 2i+1) and writes them de-interleaved, as transformers' rope_interleave does.
    Val op_rope(Args& a) {
        const auto& loc = a.call.loc;
        int q = input(loc, a.at(0, "queries"), "rope()'s queries");
        int k = input(loc, a.at(1, "keys"), "rope()'s keys");
        auto qd = g().values[q].dims, kd = g().values[k].dims;
        if (qd.size() != 2 || kd.size() != 2)
            err(loc, "rope() needs [heads, head_dim]-shaped queries and keys (annotate the projections)");
        if (qd[1] != kd[1]) err(loc, fmt::format("rope(): query head_dim {} != key head_dim {}", qd[1], kd[1]));
        std::string layer_type;
        if (auto lt = a.key("layer_type")) {
            if (lt->kind != Val::string) err(loc, "rope()'s layer_type must be a string");
            layer_type = lt->str;
        }
        bool interleaved = false;
        if (auto il = a.key("interleaved")) interleaved = bool_arg(loc, *il, "rope()'s interleaved");
        auto it = rope_.find(layer_type);
        if (it == rope_.end()) it = rope_.emplace(layer_type, rope_params(loc, qd[1], layer_type)).first;
        const RopeParams& rp = it->second;
        ir::Op op = make_op(ir::OpKind::rope, loc);
        op.in = {q, k};
        op.out = {new_value(qd, g().values[q].rows), new_value(kd, g().values[k].rows)};
        op.attr["rotary_dim"] = rp.rotary_dim;
        op.attr["q_heads"] = double(qd[0]);
        op.attr["k_heads"] = double(kd[0]);
        op.attr["head_dim"] = double(qd[1]);
        op.attr["interleaved"] = interleaved ? 1.0 : 0.0;
        op.attr["mscale"] = rp.mscale;
        op.attr["long_after"] = double(rp.long_after);
        op.table = rp.inv_freq;
        // longrope: the long frequencies follow the short ones in the same table.
        op.table.insert(op.table.end(), rp.long_inv_freq.begin(), rp.long_inv_freq.end());
        g().ops.push_back(op);
        Val t;
        t.kind = Val::tuple;
        t.items = {act(op.out[0]), act(op.out[1])};
        return t;
    }

    Val op_attention(Args& a) {
        const auto& loc = a.call.loc;
        if (head_) err(loc, "attention() cannot run on the logit rows (after the layer loop)");
        int q = input(loc, a.at(0, "queries"), "attention()'s queries");
        int k = input(loc, a.at(1, "keys"), "attention()'s keys");
        int v = input(loc, a.at(2, "values"), "attention()'s values");
        auto qd = g().values[q].dims, kd = g().values[k].dims, vd = g().values[v].dims;
        if (qd.size() != 2 || kd.size() != 2 || vd.size() != 2)
            err(loc, "attention() needs [heads, head_dim]-shaped q, k, v (annotate the projections)");
        if (qd[1] != kd[1]) err(loc, fmt::format("attention(): q head_dim {} != k head_dim {}", qd[1], kd[1]));
        if (kd[0] != vd[0]) err(loc, fmt::format("attention(): {} key heads but {} value heads", kd[0], vd[0]));
        if (vd[1] != kd[1]) err(loc, fmt::format("attention(): value head_dim {} != key head_dim {}", vd[1], kd[1]));
        if (qd[0] % kd[0] != 0)
            err(loc, fmt::format("attention(): {} query heads are not a multiple of {} kv heads", qd[0], kd[0]));
        double scale = 1.0 / std::sqrt(double(qd[1]));
        if (auto s = a.key("scale")) scale = num_arg(loc, *s, "attention()'s scale");
        // window=N: a token sees itself and the N-1 before it (transformers' sliding_window); 0: all.
        int64_t window = 0;
        if (auto w = a.key("window")) window = int_arg(loc, *w, "attention()'s window");
        if (window < 0) err(loc, fmt::format("attention(): window {} must be >= 0 (0: no window)", window));
        // softcap=c: scores become c * tanh(score / c) (Gemma 2); 0: none.
        double softcap = 0;
        if (auto c = a.key("softcap")) softcap = num_arg(loc, *c, "attention()'s softcap");
        if (softcap < 0) err(loc, fmt::format("attention(): softcap {} must be >= 0 (0: none)", softcap));
        ir::Op op = make_op(ir::OpKind::attention, loc);
        // sinks=path: one learned logit per query head that joins the softmax with no value (GPT-OSS).
        if (auto s = a.key("sinks"))
            op.weights.push_back(tensor(loc, path_arg(loc, *s, "attention()'s sinks"), {qd[0]}, ir::TensorRole::bias));
        else
            op.weights.push_back(-1);
        op.attr["window"] = double(window);
        op.attr["softcap"] = softcap;
        op.attr["sinks"] = op.weights[0] >= 0 ? 1.0 : 0.0;
        op.in = {q, k, v};
        op.out = {new_value({qd[0], vd[1]}, ir::Rows::tokens)};
        op.attr["q_heads"] = double(qd[0]);
        op.attr["kv_heads"] = double(kd[0]);
        op.attr["head_dim"] = double(qd[1]);
        op.attr["v_head_dim"] = double(vd[1]);
        op.attr["scale"] = scale;
        op.kv_index = int(g().kv.size());
        ir::KvLayout kv;
        kv.kv_heads = int(kd[0]);
        kv.head_dim = int(qd[1]);
        kv.window = int(window);
        g().kv.push_back(kv);
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    // mla(q_nope, q_rot, c, k_rot, kv_b_proj, v_dim=, scale=[, window=]): DeepSeek's multi-head latent
    // attention with the compressed KV cache. The cache holds, per token, the normalized latent c
    // [lora] and the shared rotated key k_rot [rope]; kv_b_proj's key half is absorbed into the
    // queries and its value half applied to the attended latents (vLLM's MLA decode formulation).
    Val op_mla(Args& a) {
        const auto& loc = a.call.loc;
        if (head_) err(loc, "mla() cannot run on the logit rows (after the layer loop)");
        int qn = input(loc, a.at(0, "q_nope"), "mla()'s q_nope");
        int qr = input(loc, a.at(1, "q_rot"), "mla()'s q_rot");
        int c = input(loc, a.at(2, "latent"), "mla()'s latent");
        int kr = input(loc, a.at(3, "k_rot"), "mla()'s k_rot");
        std::string wkv = path_arg(loc, a.at(4, "kv_b_proj"), "mla()'s kv_b_proj");
        auto d = [&](int v) { return g().values[v].dims; };
        if (d(qn).size() != 2 || d(qr).size() != 2 || d(qn)[0] != d(qr)[0])
            err(loc, "mla(): q_nope and q_rot must be [heads, dim] with the same heads");
        if (g().values[kr].width() != d(qr)[1]) err(loc, fmt::format("mla(): k_rot has {} floats but q_rot heads {}", g().values[kr].width(), d(qr)[1]));
        auto v_dim_val = a.key("v_dim");
        if (!v_dim_val) err(loc, "mla() needs v_dim=");
        const int64_t heads = d(qn)[0], nope = d(qn)[1], rope = d(qr)[1], lora = g().values[c].width();
        const int64_t v_dim = int_arg(loc, *v_dim_val, "mla()'s v_dim");
        double scale = 1.0 / std::sqrt(double(nope + rope));
        if (auto s = a.key("scale")) scale = num_arg(loc, *s, "mla()'s scale");
        int64_t window = 0;
        if (auto w = a.key("window")) window = int_arg(loc, *w, "mla()'s window");
        ir::Op op = make_op(ir::OpKind::mla, loc);
        op.in = {qn, qr, c, kr};
        op.weights = {tensor(loc, wkv + ".weight", {heads * (nope + v_dim), lora}, ir::TensorRole::linear)};
        op.attr["heads"] = double(heads);
        op.attr["nope"] = double(nope);
        op.attr["rope"] = double(rope);
        op.attr["lora"] = double(lora);
        op.attr["v_dim"] = double(v_dim);
        op.attr["scale"] = scale;
        op.attr["window"] = double(window);
        op.workspace = int64_t(out_.params.max_batch_tokens) * heads * (2 * lora + rope) + 64;
        op.kv_index = int(g().kv.size());
        ir::KvLayout kv;
        kv.kv_heads = 1;
        kv.head_dim = int(lora + rope);
        kv.window = int(window);
        kv.v_shared = true;
        g().kv.push_back(kv);
        op.out = {new_value({heads, v_dim}, ir::Rows::tokens)};
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    // moe(x, router, experts, experts=, top_k=, ffn=, ...): a sparse MLP.
    //   normalize=    renormalize the top-k weights (norm_topk_prob)
    //   gate=, up=, down=   per-expert tensor names under `experts` (which holds {e}); defaults
    //                 gate_proj / up_proj / down_proj (Mixtral: w1 / w3 / w2)
    //   gate_up=      GPT-OSS stacked experts instead: `experts`.<gate_up> [E, hidden, 2 ffn] with gate
    //                 and up interleaved, `experts`.<down> [E, ffn, hidden], each with a <name>_bias;
    //                 activation (clamp(up, limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit)
    //   router_bias=  the router has a bias (GPT-OSS)
    //   scoring=      "softmax" (default) or "sigmoid" (DeepSeek-V3)
    //   choice_bias=  add router.e_score_correction_bias when choosing (DeepSeek-V3)
    //   groups=, topk_groups=   grouped top-k (DeepSeek-V3 n_group, topk_group)
    //   scale=        multiply the routing weights (routed_scaling_factor)
    Val op_moe(Args& a) {
        const auto& loc = a.call.loc;
        int x = input(loc, a.at(0, "input"), "moe()'s input");
        std::string router = path_arg(loc, a.at(1, "router weight"), "moe()'s router");
        std::string experts_path = path_arg(loc, a.at(2, "expert path"), "moe()'s expert path");
        auto need = [&](const char* k) {
            auto v = a.key(k);
            if (!v) err(loc, fmt::format("moe() needs {}=", k));
            return *v;
        };
        auto str_kw = [&](const char* k, const char* dflt) {
            auto v = a.key(k);
            if (!v) return std::string(dflt);
            if (v->kind != Val::string) err(loc, fmt::format("moe()'s {} must be a string", k));
            return v->str;
        };
        auto bool_kw = [&](const char* k) {
            auto v = a.key(k);
            return v ? bool_arg(loc, *v, k) : false;
        };
        auto num_kw = [&](const char* k, double dflt) {
            auto v = a.key(k);
            return v ? num_arg(loc, *v, k) : dflt;
        };
        int64_t n_exp = int_arg(loc, need("experts"), "moe()'s experts");
        int64_t top_k = int_arg(loc, need("top_k"), "moe()'s top_k");
        int64_t ffn = int_arg(loc, need("ffn"), "moe()'s ffn");
        bool normalize = bool_kw("normalize");
        if (top_k < 1 || top_k > n_exp) err(loc, fmt::format("moe(): top_k {} must be in 1..{}", top_k, n_exp));
        std::string gate = str_kw("gate", "gate_proj"), up = str_kw("up", "up_proj"), down = str_kw("down", "down_proj");
        std::string gate_up = str_kw("gate_up", "");
        std::string scoring = str_kw("scoring", "softmax");
        if (scoring != "softmax" && scoring != "sigmoid")
            err(loc, fmt::format("moe(): scoring \"{}\" is not one of softmax, sigmoid", scoring));
        int64_t groups = a.key("groups") ? int_arg(loc, *a.key("groups"), "moe()'s groups") : 1;
        int64_t topk_groups = a.key("topk_groups") ? int_arg(loc, *a.key("topk_groups"), "moe()'s topk_groups") : groups;
        if (groups < 1 || n_exp % groups != 0 || topk_groups < 1 || topk_groups > groups)
            err(loc, fmt::format("moe(): {} experts cannot form {} groups keeping {}", n_exp, groups, topk_groups));
        if (groups > 1 && scoring != "sigmoid") err(loc, "moe(): grouped top-k is implemented for sigmoid scoring");
        if (groups > 1 && top_k > topk_groups * (n_exp / groups))
            err(loc, fmt::format("moe(): top_k {} exceeds the {} experts of {} kept groups", top_k, topk_groups * (n_exp / groups), topk_groups));
        const bool router_bias = bool_kw("router_bias"), choice_bias = bool_kw("choice_bias");
        const double scale = num_kw("scale", 1.0), alpha = num_kw("alpha", 1.702), limit = num_kw("limit", 7.0);
        const bool oai = !gate_up.empty();
        int64_t hidden = g().values[x].width();
        ir::Op op = make_op(ir::OpKind::moe, loc);
        op.in = {x};
        op.weights.push_back(tensor(loc, router + ".weight", {n_exp, hidden}, ir::TensorRole::router));
        if (oai) {
            if (experts_path.find("{e}") != std::string::npos) err(loc, "moe(): stacked experts (gate_up=) take a path without {e}");
            op.weights.push_back(tensor(loc, experts_path + "." + gate_up, {n_exp, hidden, 2 * ffn}, ir::TensorRole::linear));
            op.weights.push_back(tensor(loc, experts_path + "." + gate_up + "_bias", {n_exp, 2 * ffn}, ir::TensorRole::bias));
            op.weights.push_back(tensor(loc, experts_path + "." + down, {n_exp, ffn, hidden}, ir::TensorRole::linear));
            op.weights.push_back(tensor(loc, experts_path + "." + down + "_bias", {n_exp, hidden}, ir::TensorRole::bias));
        } else {
            if (experts_path.find("{e}") == std::string::npos) err(loc, "moe()'s expert path must contain {e}");
            for (int64_t e = 0; e < n_exp; ++e) {
                std::string base = experts_path;
                base.replace(base.find("{e}"), 3, std::to_string(e));
                op.weights.push_back(tensor(loc, base + "." + gate + ".weight", {ffn, hidden}, ir::TensorRole::linear));
                op.weights.push_back(tensor(loc, base + "." + up + ".weight", {ffn, hidden}, ir::TensorRole::linear));
                op.weights.push_back(tensor(loc, base + "." + down + ".weight", {hidden, ffn}, ir::TensorRole::linear));
            }
        }
        // Optional routing tensors come last, so weights[1..] stay the experts.
        op.attr["router_bias_index"] = -1;
        op.attr["choice_bias_index"] = -1;
        if (router_bias) {
            op.attr["router_bias_index"] = double(op.weights.size());
            op.weights.push_back(tensor(loc, router + ".bias", {n_exp}, ir::TensorRole::bias));
        }
        if (choice_bias) {
            op.attr["choice_bias_index"] = double(op.weights.size());
            op.weights.push_back(tensor(loc, router + ".e_score_correction_bias", {n_exp}, ir::TensorRole::bias));
        }
        op.attr["experts"] = double(n_exp);
        op.attr["top_k"] = double(top_k);
        op.attr["ffn"] = double(ffn);
        op.attr["hidden"] = double(hidden);
        op.attr["normalize"] = normalize;
        op.attr["layout"] = oai ? 1.0 : 0.0;               // 0: per-expert SwiGLU, 1: GPT-OSS stacked
        op.attr["scoring"] = scoring == "sigmoid" ? 1.0 : 0.0;
        op.attr["groups"] = double(groups);
        op.attr["topk_groups"] = double(topk_groups);
        op.attr["scale"] = scale;
        op.attr["alpha"] = alpha;
        op.attr["limit"] = limit;
        // Scratch for routing and per-expert row groups, for the most rows of a step: the CPU kernels'
        // layout (kernels/cpu/moe.hpp: moe_workspace_floats; the generated code asserts this is enough):
        // per row E logits, 3 K top-k ids / weights / row lists, 3 H (sum, gathered rows, expert output)
        // and the activations (2F, GPT-OSS 3F); then E + 1 counts.
        const int64_t rows = out_.params.max_batch_tokens;
        op.workspace = rows * (n_exp + 3 * top_k + 3 * hidden + (oai ? 3 : 2) * ffn) + n_exp + 1;
        op.out = {new_value({hidden}, g().values[x].rows)};
        g().ops.push_back(op);
        return act(op.out[0]);
    }

    const dsl::Program& prog_;
    const json& config_;
    const quant::Preset& preset_;
    Bound& out_;
    std::map<std::string, Val> consts_, locals_;
    std::set<std::string> recorded_;
    std::map<int, int> gathered_;
    std::map<std::string, RopeParams> rope_;  // by layer type ("": the model's one set)
    std::unordered_map<std::string, int> tensor_index_;
    std::string prefix_, current_src_;
    bool in_const_ = false, in_loop_ = false, head_ = false;
    int layer_ = -1;
};

int64_t int_or(const json& j, const char* key, int64_t dflt) {
    if (!j.contains(key)) return dflt;
    const auto& v = j[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
    return dflt;
}

}  // namespace

Bound bind(const dsl::Program& program, const json& config, const std::string& config_path,
           const std::string& stem, const quant::Preset& preset, const BuildParams& params) {
    if (!config.is_object()) fail("{}: config.json must be a JSON object", config_path);
    Bound b;
    b.stem = stem;
    b.arch = program.arch;
    b.config_path = config_path;
    b.preset = preset;
    b.params = params;
    Executor ex(program, config, preset, b);
    // The HF architecture must be one the program declares.
    Val archs = ex.config_value("/architectures/0");
    if (archs.kind != Val::string)
        fail("{}: config.json has no \"architectures\" list naming the model class", config_path);
    bool ok = false;
    for (auto& a : program.hf_architectures) ok |= a == archs.str;
    if (!ok)
        fail("{}: architecture {} is not served by {} (it serves: {})", config_path, archs.str, program.file,
             fmt::join(program.hf_architectures, ", "));
    b.hf_architecture = archs.str;
    Val maxpos = ex.config_value("/max_position_embeddings");
    if (maxpos.kind != Val::number || !maxpos.is_int || maxpos.num < 1)
        fail("{}: \"max_position_embeddings\" must be a positive integer", config_path);
    b.max_position = int64_t(maxpos.num);
    ex.run();
    for (auto& [name, text] : b.consts) {
        if (name == "vocab") b.vocab = std::stoll(text);
        if (name == "hidden") b.hidden = std::stoll(text);
        if (name == "layers") b.layers = std::stoll(text);
    }
    b.bos = int_or(config, "bos_token_id", -1);
    b.eos = int_or(config, "eos_token_id", -1);
    quant::apply_preset(b.graph, preset);  // packed weights + their scale tensors (no-op for dense presets)
    return b;
}

}  // namespace scr::bind
