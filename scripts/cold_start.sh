#!/usr/bin/env bash
# Cold start of `polylora serve` against the time it takes to read the checkpoint files (issue 13 item 6).
#
#   scripts/cold_start.sh <model dir> [--build DIR] [--port P] [--read-threads N] [-- <more serve flags>]
#
# 1. Warms the page cache (every *.safetensors file read once), then times reading the files again from it
#    three ways: one `cat` after another, one `cat` per file in parallel, and `polylora_bench read-files`
#    (pread with N threads, N = --read-threads, default the core count up to 16). The fastest is the
#    "read" time the start-up is held against.
# 2. Starts `polylora serve --model <dir> --port P` and sends a one-token completion (token-id prompt,
#    max_tokens 1, greedy) until one is answered: start-up to first served token, wall clock.
# 3. Prints the read times, start-up to first token, their ratio (the goal: at most 1.2), and the split
#    from the server's log: process start -> weights bound and their background load started ("Loading
#    weights" line), -> KV cache sized (profiling prefill), CUDA graph capture, -> weights loaded ("Loaded
#    weights": read+copy time, and how long the start-up then waited for it), -> listening, -> first token.
#    POLYLORA_BACKGROUND_WEIGHTS=0 in the environment loads the weights before the engine starts (as before).
#
# Needs bash, coreutils, curl (or python3) and python3 or awk for the arithmetic; nothing is downloaded.
# The server's log is kept in $COLD_START_LOG (default: /tmp/polylora-cold-start.log).
set -uo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
MODEL=$1; shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=""
PORT=18123
NPROC=$(nproc 2>/dev/null || echo 8)
READ_THREADS=$(( NPROC < 16 ? NPROC : 16 ))
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --read-threads) READ_THREADS=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "cold_start.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
if [ -z "$BUILD" ]; then
  for b in build-gpu build-release build; do
    if [ -x "$ROOT/$b/src/apps/polylora" ]; then BUILD=$ROOT/$b; break; fi
  done
fi
SERVE=${POLYLORA:-$BUILD/src/apps/polylora}
BENCH=${POLYLORA_BENCH:-$BUILD/bench/polylora_bench}
[ -x "$SERVE" ] || { echo "cold_start.sh: no polylora binary ($SERVE); pass --build DIR" >&2; exit 1; }
LOG=${COLD_START_LOG:-/tmp/polylora-cold-start.log}

calc() {  # calc EXPRESSION: floats with + - * / %, min(a, b), round(x, n), int(x) (python3, else awk)
  if command -v python3 >/dev/null 2>&1; then
    python3 -c "print($1)"
  else
    awk "function min(a, b) { return a < b ? a : b } function round(x, n) { return sprintf(\"%.\" n \"f\", x) }
         BEGIN { print $1 }"
  fi
}
now() { date +%s.%N; }

shopt -s nullglob
FILES=("$MODEL"/*.safetensors)
[ ${#FILES[@]} -gt 0 ] || { echo "cold_start.sh: no *.safetensors in $MODEL" >&2; exit 1; }
BYTES=$(du -cb "${FILES[@]}" | tail -1 | cut -f1)
GB=$(calc "round($BYTES / 1e9, 2)")
MEM_AVAIL_KB=$(awk '/MemAvailable/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)
echo "== checkpoint: $MODEL: ${#FILES[@]} safetensors files, $GB GB; $NPROC cores; MemAvailable $((MEM_AVAIL_KB / 1048576)) GiB"

# 1. The page cache, then the read time.
t=$(now); cat "${FILES[@]}" > /dev/null; WARM_S=$(calc "round($(now) - $t, 3)")
echo "   page-cache warm-up read: $WARM_S s"
t=$(now); cat "${FILES[@]}" > /dev/null; CAT_S=$(calc "round($(now) - $t, 3)")
t=$(now)
for f in "${FILES[@]}"; do cat "$f" > /dev/null & done
wait
PCAT_S=$(calc "round($(now) - $t, 3)")
READ_S=$(calc "min($CAT_S, $PCAT_S)")
READ_HOW="parallel cat"
[ "$READ_S" = "$CAT_S" ] && READ_HOW="sequential cat"
echo "   read from the page cache: sequential cat $CAT_S s ($(calc "round($BYTES / 1e9 / $CAT_S, 2)") GB/s), one cat per file in parallel $PCAT_S s ($(calc "round($BYTES / 1e9 / $PCAT_S, 2)") GB/s)"
if [ -x "$BENCH" ]; then
  for th in $READ_THREADS 8; do
    out=$("$BENCH" read-files "$MODEL" --threads "$th" --json 2>/dev/null) || continue
    s=$(echo "$out" | sed -n 's/.*"seconds": \([0-9.]*\).*/\1/p')
    [ -n "$s" ] || continue
    echo "   read from the page cache: polylora_bench read-files --threads $th: $s s ($(calc "round($BYTES / 1e9 / $s, 2)") GB/s)"
    if [ "$(calc "int($s < $READ_S)")" = 1 ]; then READ_S=$s; READ_HOW="pread, $th threads"; fi
    [ "$th" = 8 ] && break
  done
fi

# 2. Start-up to the first served token.
if command -v curl >/dev/null 2>&1; then
  complete() {
    curl -s -m 600 -o /tmp/polylora-cold-start.reply -w '%{http_code}' -H 'Content-Type: application/json' \
      -d '{"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0}' "http://127.0.0.1:$PORT/v1/completions" 2>/dev/null
  }
else
  complete() {
    python3 - "$PORT" <<'PY' 2>/dev/null
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", method="POST",
    data=json.dumps({"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=600) as r:
        open("/tmp/polylora-cold-start.reply", "wb").write(r.read()); print(r.status)
except Exception:
    print("000")
PY
  }
fi
START_CLOCK=$(date +%H:%M:%S.%N)
T0=$(now)
"$SERVE" serve --model "$MODEL" --port "$PORT" "${EXTRA[@]}" > "$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null' EXIT
CODE=000
while kill -0 $PID 2>/dev/null; do
  CODE=$(complete)
  [ "$CODE" = 200 ] && break
  sleep 0.02
done
T1=$(now)
if [ "$CODE" != 200 ]; then
  echo "cold_start.sh: the server exited or never answered (last HTTP status $CODE); its log ($LOG):" >&2
  tail -30 "$LOG" >&2
  exit 1
fi
FIRST_S=$(calc "round($T1 - $T0, 3)")
kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; trap - EXIT

# 3. The summary and the server's own split (its log lines carry [HH:MM:SS.mmm]).
since_start() {  # seconds from the server's start to the first log line matching $1
  local stamp
  stamp=$(grep -m1 -- "$1" "$LOG" | sed -n 's/^\[\([0-9:.]*\)\].*/\1/p')
  [ -n "$stamp" ] || { echo "-"; return; }
  local h0 m0 s0 h1 m1 s1
  IFS=: read -r h0 m0 s0 <<< "$START_CLOCK"
  IFS=: read -r h1 m1 s1 <<< "$stamp"
  calc "round((($((10#$h1)) * 3600 + $((10#$m1)) * 60 + $s1) - ($((10#$h0)) * 3600 + $((10#$m0)) * 60 + $s0) + 86400) % 86400, 2)"
}
LOAD_LINE=$(grep -m1 "Loaded weights:" "$LOG" | sed 's/^\[[^]]*\] \[[^]]*\] //')
GRAPH_LINE=$(grep -m1 "CUDA graphs: captured" "$LOG" | sed 's/^\[[^]]*\] \[[^]]*\] //')
echo "== start-up to first served token: $FIRST_S s; read $READ_S s ($READ_HOW); ratio $(calc "round($FIRST_S / $READ_S, 2)") (goal <= 1.2)"
echo "   server log split (seconds after the process started):"
echo "     weights bound       $(since_start 'Loading weights:')   (background load started; '-': loaded in the foreground)"
echo "     weights loaded      $(since_start 'Loaded weights:')   ${LOAD_LINE:-"(no 'Loaded weights' line)"}"
echo "     KV cache sized      $(since_start 'KV cache:')   (after the profiling prefill)"
echo "     graphs captured     $(since_start 'CUDA graphs: captured')   ${GRAPH_LINE:-"(no capture)"}"
echo "     listening           $(since_start 'serving the OpenAI API')"
echo "     first token served  $FIRST_S"
echo "   reply: $(head -c 300 /tmp/polylora-cold-start.reply)"
