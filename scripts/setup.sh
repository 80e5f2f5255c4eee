#!/usr/bin/env bash
# Installs every Debian package polylora's build and tests need. Idempotent; safe to re-run.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  libopenblas-dev libpcre2-dev libutf8proc-dev libxxhash-dev zlib1g-dev libcpp-httplib-dev libboost-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3
  chromium
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"
