// Every CPU kernel the generated code calls. Templates over the compiled constants only.
#pragma once

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/mla.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cpu/quant_linear.hpp"
