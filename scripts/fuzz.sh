#!/usr/bin/env bash
# Builds each tests/fuzz/*_fuzz.cc with clang + libFuzzer + AddressSanitizer and runs it for
# FUZZ_SECONDS (default 20) seconds, seeded from tests/fuzz/corpus/<target>/.
# FUZZ_SEED (default 1) fixes libFuzzer's random seed, so a CI run on a commit is reproducible: a finding
# comes back with the same seed on any machine (`FUZZ_SEED=N FUZZ_SECONDS=600 scripts/fuzz.sh`).
# FUZZ_SEED=0 lets libFuzzer pick a new seed each run (exploration; the seed it took is printed).
# A finding prints libFuzzer's report and the failing input (base64) and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
FUZZ_SEED=${FUZZ_SEED:-1}
OUT=${FUZZ_BUILD_DIR:-build-fuzz}
mkdir -p "$OUT"
CXX=clang++
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc
       -DPOLYLORA_TEST_DATA=\"$PWD/tests/data\")
# Libraries any target's sources may need (regexes, Unicode tables, gzip).
LIBS=$(pkg-config --cflags --libs libpcre2-8 libutf8proc zlib)
for src in tests/fuzz/*_fuzz.cc; do
  name=$(basename "$src" .cc)
  # Each target lists the library sources it needs in a "// fuzz-sources:" line (and in the "// src/..."
  # comment lines right after it, should clang-format have wrapped it).
  deps=$(awk '/^\/\/ fuzz-sources:/ && !done { sub("^// fuzz-sources:", ""); print; more = 1; done = 1; next }
              more && /^\/\/ src\// { sub("^// ", ""); print; next } { more = 0 }' "$src" | tr '\n' ' ')
  $CXX "${FLAGS[@]}" "$src" $deps src/common/error.cc src/common/dtype.cc src/common/utf8.cc -lfmt $LIBS -o "$OUT/$name"
  corpus="$OUT/corpus-$name"
  mkdir -p "$corpus"
  [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$corpus/"
  echo "fuzz: $name for ${FUZZ_SECONDS}s (seed $FUZZ_SEED)"
  log="$OUT/$name.log"
  rm -f "$OUT/$name-"crash-* "$OUT/$name-"leak-* "$OUT/$name-"oom-* "$OUT/$name-"timeout-*
  rc=0
  "$OUT/$name" -artifact_prefix="$OUT/$name-" -seed="$FUZZ_SEED" -max_total_time="$FUZZ_SECONDS" -max_len=65536 \
    -rss_limit_mb=4096 -print_final_stats=1 "$corpus" > "$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    echo "fuzz: $name FAILED (exit $rc); the end of its log:"
    grep -v '^"' "$log" | tail -n 80
    for f in "$OUT/$name-"*-*; do
      [ -f "$f" ] || continue
      echo "fuzz: failing input $f ($(stat -c %s "$f") bytes), base64:"
      base64 -w 0 "$f" | head -c 200000
      echo
    done
    exit "$rc"
  fi
  grep -E '^INFO: Seed:|^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "$log"
done
