#!/usr/bin/env bash
# Prepares .device-carry/ (git-ignored): headers and static libraries of Debian packages the GPU machine's
# image lacks (PCRE2, xxHash, utf8proc), with pkg-config files relative to that folder. A GPU run names
# .device-carry in `carry` and exports PKG_CONFIG_PATH=$PWD/.device-carry/lib/pkgconfig before cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
D=.device-carry
rm -rf "$D"
mkdir -p "$D/include" "$D/lib/pkgconfig"
ML=/usr/lib/x86_64-linux-gnu
cp /usr/include/pcre2.h /usr/include/xxhash.h /usr/include/xxh3.h "$D/include/"
[ -f /usr/include/utf8proc.h ] && cp /usr/include/utf8proc.h "$D/include/"
cp $ML/libpcre2-8.a "$D/lib/"
[ -f $ML/libutf8proc.a ] && cp $ML/libutf8proc.a "$D/lib/"
[ -f $ML/libxxhash.a ] && cp $ML/libxxhash.a "$D/lib/"
for name in libpcre2-8 libxxhash libutf8proc; do
  src=$ML/pkgconfig/$name.pc
  [ -f "$src" ] || continue
  sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
      -e 's|^includedir=.*|includedir=${prefix}/include|' -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
      "$src" > "$D/lib/pkgconfig/$name.pc"
done
du -sh "$D"
