// Graph passes: fusion (SwiGLU, residual adds into the producing op) and the scratch plan
// (every activation at a constant float offset of one arena, reused by liveness, in place where
// an op allows it).
#pragma once

#include <cstdint>

#include "compiler/ir/graph.hpp"

namespace scr::passes {

struct FuseStats {
    int swiglu = 0;
    int residual = 0;
};

FuseStats fuse(ir::Graph& g);

// Places every value; sets Value::offset and Graph::scratch_floats. Token-row values get
// max_tokens rows, logit-row values max_logit_rows.
void plan_memory(ir::Graph& g, int64_t max_tokens, int64_t max_logit_rows);

}  // namespace scr::passes
