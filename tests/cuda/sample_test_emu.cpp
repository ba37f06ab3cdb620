// scr_cuda_sample_emu: tests/cuda/sample_test.cu compiled for the host, the kernel running on the
// emulation in tests/cuda/host_emu (no GPU needed; 64-thread blocks, smaller problems).
#define SCR_SAMPLE_HOST_EMULATION 1
#ifndef SCR_SAMPLE_THREADS
#define SCR_SAMPLE_THREADS 64
#endif
#include "tests/cuda/sample_test.cu"
