#!/bin/bash
# Packs what the GPU machine needs from a CUDA build made here into one folder to carry:
#   [ONLY="scr_cuda_moe ..."] tests/cuda/pack_carry.sh [BUILD_DIR=build-cuda] [OUT=.cuda-carry]
# (ONLY: pack just the binaries named, not every one the build holds)
# One xz archive (the three binaries share most of their bytes, and the run tool carries at most
# 64 MiB with the working tree) of the stripped binaries plus lib/ with the shared libraries the
# GPU machine's image lacks (Debian's fmt, utf8proc, cpp-httplib, brotli; not libstdc++/libgcc/ssl/z,
# which it has in newer versions that Python there needs; nor cuBLAS/cuBLASLt, which /usr/local/cuda/lib64 has there). device_run.sh unpacks it.
# Keep OUT git-ignored (echo /.cuda-carry/ >> .git/info/exclude).
set -eu
B=${1:-build-cuda}
O=${2:-.cuda-carry}
rm -rf "$O"
stage=$(mktemp -d)
mkdir -p "$stage/lib" "$O"
linked=""
for f in "$B/scr" "$B/tests/cuda/scr_cuda_tests" "$B/tests/cuda/scr_cuda_quant_gemv" "$B/tests/cuda/scr_cuda_linear" "$B/tests/cuda/scr_cuda_sample" "$B/tests/cuda/scr_cuda_moe" "$B/tests/cuda/scr_cuda_attention"; do
    [ -f "$f" ] || continue
    [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $(basename "$f") "* ]] || continue
    strip -o "$stage/$(basename "$f")" "$f"
    linked+="  $(basename "$f") $(date -u -r "$f" '+%Y-%m-%d %H:%M UTC')"$'\n'
    ldd "$f" | awk '/=> \//{print $3}' | grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libpcre2-8|libssl|libcrypto|libz|libcublas|libcublasLt|ld-linux[^/]*)\.so' |
        while read -r lib; do cp -Ln "$lib" "$stage/lib/" 2>/dev/null || true; done
done
# What the binaries were built from, named by device_unpack on the GPU machine (that machine's copy
# of the tree may be at another commit): the commit of BUILD_DIR's source tree when packed
# ("-dirty": it had uncommitted changes) and when each binary was linked.
src=$(sed -n "s/^CMAKE_HOME_DIRECTORY:INTERNAL=//p" "$B/CMakeCache.txt")
printf 'source %s when packed; linked:\n%s' "$(git -C "$src" describe --always --dirty 2>/dev/null || echo '(not a git tree)')" \
    "$linked" > "$stage/BUILD"
# --x86: the branch-call filter for x86 code, ~6 % smaller than plain -9e on these binaries (tar -xJf reads it).
tar -C "$stage" -cf - . | xz --x86 --lzma2=preset=9e -T1 > "$O/bin.tar.xz"
rm -rf "$stage"
ls -la "$O"
