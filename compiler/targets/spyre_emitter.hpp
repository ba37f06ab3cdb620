// The Spyre target: scrc plans every op's tiles (spyre_plan.hpp) and writes a .cpp whose forward()
// runs that tiled program on the host emulator (kernels/spyre/), with the plan as constexpr
// constants re-checked by static_assert.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/bind/binder.hpp"

namespace scr::emit {

std::string emit_spyre(const bind::Bound& b, int64_t scratchpad_bytes);

// What `scrc plan --target spyre` prints: the common plan and the Spyre tiles.
std::string spyre_plan_report(const bind::Bound& b, int64_t scratchpad_bytes);

}  // namespace scr::emit
