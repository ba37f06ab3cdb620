// The dataflow graph scrc builds by executing an architecture with every constant bound.
//
// It is straight-line: layers are unrolled (each op knows its layer), every activation is a
// [rows, width] float32 matrix whose width is a constant, and rows is the only run-time number
// (tokens in the step, or logit rows after the head's gather). Passes fuse ops and place every
// value at a constant offset of the scratch arena; emitters turn the result into target code.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/dsl/ast.hpp"
#include "runtime/core/dtype.hpp"

namespace scr::ir {

enum class Rows { tokens, logits };  // all tokens of the step, or only the rows that want logits

struct Value {
    int id = -1;
    std::vector<int64_t> dims;  // per-row shape, e.g. {heads, head_dim}
    Rows rows = Rows::tokens;
    std::string name;           // DSL variable it was bound to (for comments)
    int64_t offset = -1;        // in floats from the scratch base, set by plan_memory
    int alias_of = -1;          // value whose storage this one reuses (in-place ops)
    int64_t width() const {
        int64_t w = 1;
        for (auto d : dims) w *= d;
        return w;
    }
};

enum class TensorRole { embedding, linear, norm, bias, router };

struct Tensor {
    std::string name;             // checkpoint name, e.g. "model.layers.0.mlp.up_proj.weight"
    std::vector<int64_t> shape;
    TensorRole role;
    DType dtype = DType::f32;     // set by the quant preset
    bool optional = false;
    // Quantized storage (compiler/quant/apply.cpp): `shape`/`dtype` are then the packed tensor's,
    // `logical` the [out, in] matrix the kernels compute with, and scales/biases the indices of its
    // companion tensors (biases: MLX affine only; -1 when absent).
    std::vector<int64_t> logical;
    int scales = -1, biases = -1;
    bool quantized() const { return scales >= 0; }
};

enum class OpKind {
    embed,          // ids -> rows of the embedding table
    rmsnorm,        // over the last dim; attr eps, dim, offset (1: scale by 1 + w, Gemma)
    linear,         // y = x W^T (+ b) (+ residual, after fusion)
    linear_swiglu,  // y = silu(x Wg^T) * (x Wu^T)        (fused from silu, mul, two linears)
    rope,           // rotate q and k in place (neox layout, rotate_half); attr rotary_dim, interleaved
                    // (pairs 2i,2i+1), mscale (cos/sin factor), long_after (> 0: longrope, table holds
                    // short then long frequencies; long when the sequence is longer than long_after)
    attention,      // append k, v to this layer's KV blocks; causal attention over the sequence
                    // attr: scale, window (0 = all), softcap (0 = none), sinks (1: weights[0] = [q_heads] logits)
    moe,            // router softmax top-k, expert SwiGLU MLPs, weighted sum
    mla,            // multi-head latent attention (DeepSeek): in q_nope [H,NOPE], q_rot [H,R], latent c [1,L],
                    // k_rot [1,R]; weights[0] kv_b_proj [H*(NOPE+V), L]; caches [c, k_rot] per token (one
                    // shared row, values = its first L floats); out [H,V]. attr heads, nope, rope, lora,
                    // v_dim, scale, window; workspace for the absorbed queries and latent outputs
    add, mul, silu, // elementwise
    scale,          // y = x * attr factor (a compile-time number: Granite's multipliers, Gemma's sqrt(hidden))
    gelu_tanh,      // y = gelu(x, approximate="tanh") (gelu_pytorch_tanh)
    linear_geglu,   // y = gelu_tanh(x Wg^T) * (x Wu^T)   (fused like linear_swiglu)
    softcap,        // y = cap * tanh(x / cap), attr cap
    slice,          // y[r] = runs of x[r]: attr outer runs of len floats, stride apart, from offset (split())
    gather_rows,    // tokens -> logit rows
};

const char* op_name(OpKind k);

struct Op {
    OpKind kind;
    std::vector<int> in;        // value ids
    std::vector<int> out;       // value ids
    std::vector<int> weights;   // tensor ids (-1 for an absent optional, e.g. no bias)
    int layer = -1;             // layer index inside the unrolled loop, -1 outside
    int kv_index = -1;          // attention: which KV slot set (ordinal of attention ops)
    std::map<std::string, double> attr;            // eps, scale, top_k, ...
    std::vector<float> table;                      // rope inverse frequencies
    int residual = -1;          // linear: value added to the output (fused residual add)
    int64_t workspace = 0;      // extra floats of scratch for this op (MoE), at workspace_offset
    int64_t workspace_offset = -1;
    dsl::SourceLoc loc;
    std::string src;            // the DSL statement, for comments in generated code
};

struct KvLayout {
    int kv_heads = 0, head_dim = 0;
    int64_t k_offset = 0, v_offset = 0;  // bytes inside one block
    int window = 0;                      // sliding window in tokens (0: the whole sequence)
    bool v_shared = false;               // MLA: no separate V; values are the first floats of each K row
};

struct Graph {
    std::vector<Value> values;
    std::vector<Op> ops;
    std::vector<Tensor> tensors;
    std::vector<KvLayout> kv;    // one per attention op, in order
    int output = -1;             // the logits value
    int64_t scratch_floats = 0;  // set by plan_memory
};

}  // namespace scr::ir
