// Does a CUDA graph of many PDL kernels run slower when it is launched behind a running graph
// (queued) than when launched into an idle stream (gapped)? scr's run-ahead steps run their kernels
// 2-3.5 % slower than steps with a gap (docs/CUDA.md, "Session 25" has what this probe measured:
// no such slowdown here). Each kernel streams its own slice of weights (a GEMV-like read, loads
// issued before griddepcontrol.wait) and writes a small output; kernels chained with programmatic
// dependent launch, as in scr's decode graphs. Modes: gapped (host syncs after each graph), all
// queued at once, gapped with a cudaEventQuery spin, and the engine's pattern (one or two steps in
// flight, the host enqueueing the next when the oldest is done), plain or with a kernel reading
// the step from pinned host memory before the graph and a (cluster) kernel writing a token to mapped
// host memory after it. On the GPU machine:
//   scr_cuda_queued_graph_probe KERNELS MB_PER_KERNEL PDL(0/1) AHEAD(0/1) CLUSTER(0/1)
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

__global__ void __launch_bounds__(256) stream_kernel(const uint4* __restrict__ w, size_t n16, const float* in, float* out, int trig_start) {
    if (trig_start) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    // weight loads before the wait, as scr's GEMV does
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
    uint4 a[8]; int k = 0;
    for (size_t j = i; j < n16 && k < 8; j += stride, ++k) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a[k].x), "=r"(a[k].y), "=r"(a[k].z), "=r"(a[k].w) : "l"(w + j));
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    float s = in[threadIdx.x & 31];
    for (int q = 0; q < k; ++q) s += __uint_as_float(a[q].x ^ a[q].y) + __uint_as_float(a[q].z ^ a[q].w);
    for (size_t j = i + size_t(8) * stride; j < n16; j += stride) {
        uint4 b;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "l"(w + j));
        s += __uint_as_float(b.x ^ b.y) + __uint_as_float(b.z ^ b.w);
    }
    if (s == 1234.5f) out[blockIdx.x] = s;  // keeps the loads
    if (threadIdx.x == 0) out[blockIdx.x] += 1.0f;
}

// Like scr's step: the arrays read from pinned host memory by a kernel before the graph, and the
// sampler's token written to mapped host memory after it.
__global__ void copy_in(const int* host, int* dev, int n) { for (int i = threadIdx.x; i < n; i += blockDim.x) dev[i] = host[i]; }
__global__ void sample_out(const float* out, volatile int* host_tok, int* dev_ids) {
    __shared__ float m; if (threadIdx.x == 0) m = out[blockIdx.x];
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) { host_tok[0] = int(m); dev_ids[0] = int(m); }
}
__global__ void __cluster_dims__(8, 1, 1) sample_cluster(const float* out, volatile int* host_tok, int* dev_ids) {
    __shared__ float m; if (threadIdx.x == 0) m = out[blockIdx.x];
    __syncthreads();
    asm volatile("barrier.cluster.arrive; barrier.cluster.wait;" ::: "memory");
    if (blockIdx.x == 0 && threadIdx.x == 0) { host_tok[0] = int(m); dev_ids[0] = int(m); }
}

int main(int argc, char** argv) {
    const int kernels = argc > 1 ? atoi(argv[1]) : 160;
    const double mb = argc > 2 ? atof(argv[2]) : 12.0;
    const int pdl = argc > 3 ? atoi(argv[3]) : 1;
    const int iters = 60;
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t bytes = size_t(mb * 1e6) / 16 * 16;
    // each kernel its own slice, total well above L2
    char* w; CK(cudaMalloc(&w, bytes * kernels));
    CK(cudaMemset(w, 1, bytes * kernels));
    float *in, *out; CK(cudaMalloc(&in, 4096)); CK(cudaMalloc(&out, 1 << 20)); CK(cudaMemset(in, 0, 4096)); CK(cudaMemset(out, 0, 1 << 20));
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < kernels; ++k) {
        cudaLaunchConfig_t cfg = {}; cudaLaunchAttribute at[1];
        cfg.gridDim = dim3(sms * 2); cfg.blockDim = dim3(256); cfg.stream = s;
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = pdl;
        cfg.attrs = at; cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, stream_kernel, (const uint4*)(w + bytes * k), bytes / 16, (const float*)in, out, 1));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<cudaEvent_t> ev(iters + 1);
    for (auto& x : ev) CK(cudaEventCreate(&x));
    int *hin, *htok, *dtok, *dids; CK(cudaMallocHost(&hin, 4096)); CK(cudaHostAlloc(&htok, 64, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer(&dtok, htok, 0)); CK(cudaMalloc(&dids, 4096));
    const int ahead = argc > 4 ? atoi(argv[4]) : 0;
    const int cluster = argc > 5 ? atoi(argv[5]) : 0;
    for (int r = 0; r < 3; ++r) {
        for (int mode = 0; mode < 5; ++mode) {
            // mode 0: gapped (sync after each graph); 1: queued (all launched, events between); 2: gapped but
            // the host polls cudaEventQuery instead of synchronizing
            std::vector<float> t;
            CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));  // warm
            if (mode == 3 || mode == 4) {
                // the engine's pattern: two steps in flight; when the older is done, the host reads its token
                // and enqueues one more (3: plain graphs; 4: with the copy-in and sample-out kernels)
                std::vector<cudaEvent_t> bev(iters + 2), eev(iters + 2);
                for (auto& x : bev) CK(cudaEventCreate(&x));
                for (auto& x : eev) CK(cudaEventCreate(&x));
                auto enqueue = [&](int i) {
                    if (mode == 4) { for (int j = 0; j < 256; ++j) hin[j] = i + j; copy_in<<<1, 256, 0, s>>>(hin, dids, 256); }
                    CK(cudaEventRecord(bev[i], s)); CK(cudaGraphLaunch(ge, s));
                    if (mode == 4) { if (cluster) sample_cluster<<<8, 256, 0, s>>>(out, dtok, dids); else sample_out<<<8, 256, 0, s>>>(out, dtok, dids); }
                    CK(cudaEventRecord(eev[i], s));
                };
                enqueue(0); if (ahead) enqueue(1);
                for (int i = 0; i < iters; ++i) {
                    CK(cudaEventSynchronize(eev[i]));
                    volatile int tok = htok[0]; (void)tok;
                    if (i + 1 + ahead < iters + 1) enqueue(i + 1 + ahead);
                }
                CK(cudaStreamSynchronize(s));
                for (int i = 1; i < iters; ++i) { float ms; CK(cudaEventElapsedTime(&ms, bev[i], eev[i])); t.push_back(ms * 1e3f); }
                for (auto& x : bev) cudaEventDestroy(x);
                for (auto& x : eev) cudaEventDestroy(x);
            } else if (mode == 1) {
                CK(cudaEventRecord(ev[0], s));
                for (int i = 0; i < iters; ++i) { CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(ev[i + 1], s)); }
                CK(cudaStreamSynchronize(s));
                for (int i = 0; i < iters; ++i) { float ms; CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1])); t.push_back(ms * 1e3f); }
            } else {
                for (int i = 0; i < iters; ++i) {
                    CK(cudaEventRecord(ev[0], s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(ev[1], s));
                    if (mode == 0) CK(cudaEventSynchronize(ev[1]));
                    else while (cudaEventQuery(ev[1]) == cudaErrorNotReady) {}
                    float ms; CK(cudaEventElapsedTime(&ms, ev[0], ev[1])); t.push_back(ms * 1e3f);
                }
            }
            std::sort(t.begin(), t.end());
            printf("kernels %d x %.1f MB pdl %d  %-22s median %8.1f us  p10 %8.1f  p90 %8.1f  (%.2f us per kernel)\n", kernels, mb, pdl,
                   mode == 0 ? "gapped (sync)" : mode == 1 ? "queued (all at once)" : mode == 2 ? "gapped (query spin)" : mode == 3 ? (ahead ? "engine, ahead" : "engine, gapped") : (ahead ? (cluster ? "engine+io+cl, ahead" : "engine+io, ahead") : (cluster ? "engine+io+cl, gapped" : "engine+io, gapped")), t[t.size() / 2], t[t.size() / 10],
                   t[t.size() * 9 / 10], t[t.size() / 2] / kernels);
        }
    }
    return 0;
}
