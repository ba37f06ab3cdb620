#include "compiler/ir/graph.hpp"

namespace scr::ir {

const char* op_name(OpKind k) {
    switch (k) {
        case OpKind::embed: return "embed";
        case OpKind::rmsnorm: return "rmsnorm";
        case OpKind::linear: return "linear";
        case OpKind::linear_swiglu: return "linear_swiglu";
        case OpKind::rope: return "rope";
        case OpKind::attention: return "attention";
        case OpKind::moe: return "moe";
        case OpKind::add: return "add";
        case OpKind::mul: return "mul";
        case OpKind::silu: return "silu";
        case OpKind::scale: return "scale";
        case OpKind::gelu_tanh: return "gelu_tanh";
        case OpKind::linear_geglu: return "linear_geglu";
        case OpKind::softcap: return "softcap";
        case OpKind::slice: return "slice";
        case OpKind::mla: return "mla";
        case OpKind::gather_rows: return "gather_rows";
    }
    return "?";
}

}  // namespace scr::ir
