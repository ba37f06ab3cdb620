# The CUDA target (-DSCR_TARGET=cuda): generated models are .cu files compiled by nvcc for Hopper
# (sm_90a, so wgmma/setmaxnreg are available to kernels that want them), linked with the static
# CUDA runtime and static libstdc++/libgcc so the binary built here runs on the GPU machine.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
set(CMAKE_CUDA_ARCHITECTURES OFF)  # the -gencode below says it exactly
enable_language(CUDA)
# CMake 3.25 predates nvcc's C++20 support: teach it the flag.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
set(SCR_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a" CACHE STRING "nvcc code generation for the CUDA target")
string(APPEND CMAKE_CUDA_FLAGS " ${SCR_CUDA_GENCODE} -Xcompiler=-Wall -Xcompiler=-Wno-unused-parameter")
# kernels/cuda/quant_linear.cuh's shared-memory GEMV reads int4 weights as float32 denormals:
# flushing denormals to zero would silently zero them.
if(CMAKE_CUDA_FLAGS MATCHES "use_fast_math|ftz=true")
  message(FATAL_ERROR "Scratchy's CUDA target needs float32 denormals (int4 weights are read as denormals, "
                      "kernels/cuda/quant_linear.cuh): drop --use_fast_math / -ftz=true from CMAKE_CUDA_FLAGS")
endif()
find_package(CUDAToolkit REQUIRED)
add_link_options(-static-libstdc++ -static-libgcc)
add_subdirectory(${PROJECT_SOURCE_DIR}/runtime/cuda ${PROJECT_BINARY_DIR}/runtime/cuda)
message(STATUS "Scratchy: CUDA target, nvcc ${CMAKE_CUDA_COMPILER_VERSION}, ${SCR_CUDA_GENCODE}")
