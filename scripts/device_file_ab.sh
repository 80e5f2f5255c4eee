#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): an A/B of a kernel change that has no
# switch, in one call. FILES: the changed files (paths from the repository root), whose old versions lie in
# .device-carry/old/<basename> (e.g. `git show HEAD:path > .device-carry/old/<basename>` before carrying).
# Builds the tree as it is; the GPU tests TESTS (a gtest filter; none if unset); `polylora_bench device`
# MXFP4 prefill (512-token prompts, BATCHES (16) sequences, 8 adapters); then the old files in place, the
# benchmark rebuilt and run again; then the new ones back and once more (REPEAT=0 skips) for the spread.
# Results printed last.
set -uo pipefail
OUT=${OUT:-/tmp/file_ab}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
TG=$(find build-gpu -name test_gpu -type f | head -1)
if [ -n "${TESTS:-}" ]; then
  timeout 200 "$TG" --gtest_filter="$TESTS" --gtest_brief=1 > "$OUT/tests.txt" 2>&1
  echo "tests rc $?" >> "$OUT/r.txt"
  grep -E "PASSED|FAILED|Failure" "$OUT/tests.txt" | head -12 >> "$OUT/r.txt"
  stamp tests
fi
bench() {
  echo "== $1" >> "$OUT/r.txt"
  timeout 100 build-gpu/bench/polylora_bench device --config tests/data/configs/gpt-oss-20b --device cuda \
    --prompt-len 512 --decode-tokens 4 --batches "${BATCHES:-16}" --loras 8 2>&1 >/dev/null |
    grep -E "^batch.*prefill" >> "$OUT/r.txt"
}
bench new
mkdir -p /tmp/new-files
for f in $FILES; do cp "$f" "/tmp/new-files/$(basename "$f")"; cp ".device-carry/old/$(basename "$f")" "$f"; done
ninja -C build-gpu -j16 polylora_bench >> "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
stamp "build old"
bench old
for f in $FILES; do cp "/tmp/new-files/$(basename "$f")" "$f"; done
if [ "${REPEAT:-1}" = 1 ]; then
  ninja -C build-gpu -j16 polylora_bench >> "$OUT/build.txt" 2>&1
  bench new-again
fi
stamp bench
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
cat "$OUT/r.txt"
