#!/bin/bash
# Packs a CUDA build of llama.cpp made here (never committed, never in the repo) into one folder to
# carry to the GPU machine for bench/cuda/compare_llamacpp_cuda.sh:
#   bench/cuda/pack_llamacpp.sh LLAMA_BUILD_DIR [OUT=.lcpp-carry]
# LLAMA_BUILD_DIR: a build with BUILD_SHARED_LIBS=ON (one copy of ggml-cuda's kernels shared by the
# three tools instead of one per executable), e.g. (docs/PERF.md, "Session 22 (2026-12-03): llama.cpp built and run on the same machine"):
#   cmake -S llama.cpp -B lcpp-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90a-real -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON \
#     -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
#     -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
#   ninja -C lcpp-build llama-bench llama-quantize llama-batched-bench
# (for bench/cuda/serve_peers.sh: -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=OFF and the target
# llama-server; whichever of the four tools the build holds are packed)
# The archive holds the stripped tools, bin/*.so* and this machine's libgomp and libcudart; cuBLAS
# comes from /usr/local/cuda/lib64 on the GPU machine (the executables link with
# -Wl,--allow-shlib-undefined here: libcuda.so.1 is the GPU machine's driver). Keep OUT git-ignored (echo /.lcpp-carry/ >> .git/info/exclude).
set -eu
B=$1
O=${2:-.lcpp-carry}
rm -rf "$O"
stage=$(mktemp -d)
mkdir -p "$stage/lib" "$O"
for t in llama-bench llama-quantize llama-batched-bench llama-server; do  # those the build made
    [ -f "$B/bin/$t" ] && strip -o "$stage/$t" "$B/bin/$t"
done
for lib in "$B"/bin/lib*.so*; do
    [ -L "$lib" ] && { cp -P "$lib" "$stage/lib/"; continue; }
    strip --strip-unneeded -o "$stage/lib/$(basename "$lib")" "$lib"
done
# The OpenMP and CUDA runtimes of this machine (the GPU machine's image need not have the same ones).
for lib in $(ldd "$B/bin/libggml-cuda.so" "$B/bin/libggml-cpu.so" | awk '/(libgomp|libcudart)\.so/{print $3}' | sort -u); do
    cp -L "$lib" "$stage/lib/"
done
src=$(sed -n "s/^CMAKE_HOME_DIRECTORY:INTERNAL=//p" "$B/CMakeCache.txt")
# named in the comparison's log: the source's commit, or (a tree exported by `git archive`) its COMMIT file
git -C "$src" rev-parse --short HEAD > "$stage/COMMIT" 2>/dev/null || cp "$src/COMMIT" "$stage/COMMIT"
tar -C "$stage" -cf - . | xz --x86 --lzma2=preset=9e -T1 > "$O/bin.tar.xz"
rm -rf "$stage"
ls -la "$O"
