#!/usr/bin/env bash
# Prepares .device-carry/ (git-ignored): headers and static libraries of Debian packages the GPU machine's
# image lacks (PCRE2, xxHash, utf8proc), with pkg-config files relative to that folder. A GPU run names
# .device-carry in `carry` and exports PKG_CONFIG_PATH=$PWD/.device-carry/lib/pkgconfig (and
# LD_LIBRARY_PATH=$PWD/.device-carry/lib) before cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
D=.device-carry
# Kept across a rebuild: the peers' harnesses with what earlier sessions added beside them (vllm_kernel.py,
# docs/gpu-machine.md) and a carried llama.cpp tree.
KEEP=$(mktemp -d)
for keep in peers llama.cpp llama.cpp.tar.xz; do [ -e "$D/$keep" ] && mv "$D/$keep" "$KEEP/"; done
rm -rf "$D"
mkdir -p "$D/include" "$D/lib/pkgconfig"
for keep in peers llama.cpp llama.cpp.tar.xz; do [ -e "$KEEP/$keep" ] && mv "$KEEP/$keep" "$D/"; done
rmdir "$KEEP" 2>/dev/null || rm -rf "$KEEP"
# The shared peers' harnesses (serve_bench.sh, llama_bench.sh, ...), newest over any kept copy.
if [ -d ../shared/peers ]; then
  mkdir -p "$D/peers"
  cp ../shared/peers/*.sh ../shared/peers/*.py "$D/peers/" 2>/dev/null || true
fi
ML=/usr/lib/x86_64-linux-gnu
cp /usr/include/pcre2.h /usr/include/xxhash.h /usr/include/xxh3.h "$D/include/"
[ -f /usr/include/utf8proc.h ] && cp /usr/include/utf8proc.h "$D/include/"
cp $ML/libpcre2-8.a "$D/lib/"
# cpp-httplib is compiled as a shared library in Debian: carry it (its own deps, OpenSSL 3, zlib and brotli,
# are on the image); binaries find it through LD_LIBRARY_PATH=$PWD/.device-carry/lib.
cp /usr/include/httplib.h "$D/include/"
cp -P $ML/libcpp-httplib.so* "$D/lib/"
# httplib.h includes the OpenSSL and brotli headers (the library was built with them; the defines in its
# .pc keep the class layout identical), which the image may lack.
cp -r /usr/include/openssl /usr/include/brotli "$D/include/"
cp /usr/include/x86_64-linux-gnu/openssl/* "$D/include/openssl/"
[ -f $ML/libutf8proc.a ] && cp $ML/libutf8proc.a "$D/lib/"
[ -f $ML/libxxhash.a ] && cp $ML/libxxhash.a "$D/lib/"
for name in libpcre2-8 libxxhash libutf8proc cpp-httplib; do
  src=$ML/pkgconfig/$name.pc
  [ -f "$src" ] || continue
  sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
      -e 's|^includedir=.*|includedir=${prefix}/include|' -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
      -e '/^Requires.private:/d' "$src" > "$D/lib/pkgconfig/$name.pc"
done
# Boost headers (Asio + Beast, header-only) as a tarball: a GPU run without /usr/include/boost unpacks it
# into .device-carry/include and points BOOST_INCLUDEDIR there.
tar -C /usr/include -cJf "$D/boost-headers.tar.xz" boost
# LLAMA=1: llama.cpp's pruned source (../shared/peers/prepare_llama.sh, from npm) as a tarball for
# scripts/device_peers.sh (peer code: measured beside polylora, never committed or copied from).
if [ "${LLAMA:-0}" = 1 ] && [ ! -f "$D/llama.cpp.tar.xz" ]; then
  T=$(mktemp -d)
  bash "$D/peers/prepare_llama.sh" "$T/llama.cpp" > /dev/null
  tar -C "$T/llama.cpp" -cJf "$D/llama.cpp.tar.xz" .
  rm -rf "$T"
fi
du -sh "$D"
