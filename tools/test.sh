#!/usr/bin/env bash
# Builds Scratchy and runs every test, as CI does (.ci/run calls this):
#  1. the main build: the tiny test models (f32 + bf16) and the embedded default model, all tests;
#     1b. tiny-llama and tiny-qwen3-moe with the quantized presets: scr quantize and the quantized
#         kernels end to end;
#  2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer;
#  3. the spyre target (emulator tests + the expected-to-fail plan) and a CUDA compile check,
#     when those targets are present in the tree;
#  4. every libFuzzer target for 45 s (clang).
# Usage: tools/test.sh [--quick]   (--quick: step 1 only)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
quick=0; [ "${1:-}" = "--quick" ] && quick=1

# Independent oracles for the text and server tests (npm packages, never committed).
npm ci --silent --no-audit --no-fund --prefix tools/oracles
npm ci --silent --no-audit --no-fund --prefix tests/server
export SCR_REQUIRE_ORACLES=1

echo "== 1. main build and tests"
cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSCR_TESTS=ON -DSCR_MODELS="tiny-*;scratchy-tiny" -DSCR_QUANT="f32;bf16"
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs" --timeout 900
[ $quick -eq 1 ] && exit 0

echo "== 1b. quantized presets end to end (scr quantize, logits vs the dequantized reference, bad inputs; MoE experts too)"
P=$PWD/tests/quant/presets
cmake -S . -B build-quant-ci -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCR_TESTS=ON -DSCR_MODELS="tiny-llama;tiny-qwen3-moe" \
  -DSCR_QUANT="f32;mlx-int4-g32;int8;fp8;fp8-tensor;$P/mlx-int4-g32-kvf32.json;$P/int8-kvf32.json;$P/fp8-kvf32.json"
cmake --build build-quant-ci -j"$jobs" --target scr scr_quant_kernel_tests scr_quant_compiler_tests
ctest --test-dir build-quant-ci -L quant --output-on-failure -j"$jobs" --timeout 900

echo "== 2. unit, parser and engine tests under ASan + UBSan"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSCR_SANITIZE=ON -DSCR_TESTS=ON \
  -DSCR_MODELS="tiny-llama" -DSCR_QUANT="f32"
cmake --build build-asan -j"$jobs" --target scr_compiler_tests scr_weights_tests text_tests scr_engine_tests \
  scr_server_tests scr_quant_kernel_tests scr_core_tests scr_model_tests
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -L "unit|text|engine|server|quant" -LE "server-node|server-e2e|models|spyre" \
  --output-on-failure -j"$jobs" --timeout 900
# config.json selection: its mutation test (the fuzz entry point's inputs) and the refusal of an
# uncompiled config; the model suite's other tests need models and presets (bf16) this build lacks.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  build-asan/tests/model/scr_model_tests --gtest_filter='Selection.MutatedConfigsNeverCrash:Selection.UncompiledConfigIsRefusedWithTheDifference'

if [ -f tests/spyre/CMakeLists.txt ]; then
  echo "== 3a. spyre target: emulator tests and the expected-to-fail plans"
  cmake -S . -B build-spyre-ci -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCR_TARGET=spyre -DSCR_TESTS=ON \
    -DSCR_MODELS="tiny-llama;tiny-qwen3;tiny-qwen3-moe;tiny-llama-h64;tiny-qwen3-h64;tiny-qwen3-moe-h64;tiny-granite-h64" -DSCR_QUANT="f32"
  cmake --build build-spyre-ci -j"$jobs" --target scr spyre_unit_tests spyre_fixture_tests
  ctest --test-dir build-spyre-ci -L spyre --output-on-failure -j"$jobs" --timeout 900
fi
if [ -f compiler/targets/cuda_emitter.cpp ] && command -v nvcc >/dev/null 2>&1; then
  echo "== 3b. CUDA target compiles (no GPU here)"
  # tiny-qwen3-moe-h64: hidden and expert widths of 64, so the wide-step MoE kernel is compiled too;
  # tiny-llama bf16 instantiates the persistent batch-1 decode kernel. The GPU tests are compiled
  # too (they run on the device machine: tests/cuda/device_run.sh), so their code cannot rot.
  cmake -S . -B build-cuda-ci -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCR_TARGET=cuda -DSCR_NATIVE=OFF \
    -DSCR_MODELS="tiny-llama;tiny-qwen3-moe;tiny-qwen3-moe-h64" -DSCR_QUANT="bf16" -DSCR_TESTS=ON
  cmake --build build-cuda-ci -j"$jobs" --target scr scr_cuda_tests scr_cuda_linear scr_cuda_moe scr_cuda_attention \
    scr_cuda_sample scr_cuda_quant_gemv scr_cuda_upload_probe scr_cuda_queued_graph_probe
  # The quantized tensor-core kernels' data paths emulated on the host (no GPU needed): the unpacking
  # tricks, a warp of quant_mma_kernel, a block of quant_wide_kernel, the split rules.
  build-cuda-ci/tests/cuda/scr_cuda_quant_gemv --host-selftest
  # The quantized kernels (MLX int4, int8, fp8 per channel and per tensor) too, dense and MoE
  # experts (kernels/cuda/moe_quant.cuh): the same build folder reconfigured, so only the generated
  # models and the link are redone.
  cmake -S . -B build-cuda-ci -DSCR_MODELS="tiny-llama;tiny-qwen3-moe" -DSCR_QUANT="mlx-int4-g32;int8;fp8;fp8-tensor"
  cmake --build build-cuda-ci -j"$jobs" --target scr
fi
if command -v clang++ >/dev/null 2>&1; then
  echo "== 4. libFuzzer on the parsers of untrusted input (config.json, safetensors, tokenizer/templates, HTTP)"
  tools/fuzz.sh 45
fi
echo "== all test stages passed"
