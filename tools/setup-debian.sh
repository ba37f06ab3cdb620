#!/usr/bin/env bash
# Installs what Scratchy builds and tests with on Debian 12: the toolchain, the Debian packages of
# our dependencies, and Node for the test oracles. Idempotent; uses sudo when not root.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
packages=(
  build-essential cmake ninja-build pkg-config python3
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libcpp-httplib-dev
  libutf8proc-dev libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup-debian: dependencies present"
