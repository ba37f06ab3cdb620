// Host emulation (see cuda_runtime.h here): the one runtime-API type kernels/cuda/sample.hpp names.
#pragma once
typedef struct CUstream_st* cudaStream_t;
