#!/usr/bin/env bash
# Builds each tests/fuzz/*_fuzz.cc with clang + libFuzzer + AddressSanitizer and runs it for
# FUZZ_SECONDS (default 20) seconds, seeded from tests/fuzz/corpus/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
OUT=${FUZZ_BUILD_DIR:-build-fuzz}
mkdir -p "$OUT"
CXX=clang++
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc
       -DPOLYLORA_TEST_DATA=\"$PWD/tests/data\")
# Libraries any target's sources may need (regexes, Unicode tables, gzip).
LIBS=$(pkg-config --cflags --libs libpcre2-8 libutf8proc zlib)
for src in tests/fuzz/*_fuzz.cc; do
  name=$(basename "$src" .cc)
  # Each target lists the library sources it needs in a "// fuzz-sources:" line.
  deps=$(grep -m1 '^// fuzz-sources:' "$src" | sed 's|// fuzz-sources:||')
  $CXX "${FLAGS[@]}" "$src" $deps src/common/error.cc src/common/dtype.cc src/common/utf8.cc -lfmt $LIBS -o "$OUT/$name"
  corpus="$OUT/corpus-$name"
  mkdir -p "$corpus"
  [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$corpus/"
  echo "fuzz: $name for ${FUZZ_SECONDS}s"
  "$OUT/$name" -artifact_prefix="$OUT/$name-" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -rss_limit_mb=4096 -print_final_stats=1 "$corpus" 2>&1 | tail -3
done
