#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"] with .device-carry/peers): issue 17's
# H200 check. GPT-OSS-20B dummy (the MXFP4 config unless CONFIG says otherwise), 64 random r=16 adapters on
# attention + experts (gen_adapters.py; 8 generated, the other 56 hard links of their files, so every name is
# a separate adapter to the server), `polylora bench serve` with random adapter assignment at each
# concurrency (CONCS, default "16 64"), twice:
#   resident  --max-loras 64: every adapter in a device slot from the first request on (warmed up first)
#   tiers     --max-loras 8 --max-cpu-loras 64: 8 device slots, the rest from host memory on demand
# Prints OTPS and p99 / median TTFT of both and their ratios (goals: OTPS >= 0.85x, p99 TTFT <= 2x), the
# tiers run's loads, evictions, uploads (from /metrics: polylora:adapter_upload_seconds/_bytes_total) as
# loads per second and seconds / GB/s per adapter swap, and the pinned host-to-device copy rate measured in
# the same run (torch, 1 GiB) for comparison. Writes $OUT/tiers.txt and the servers' logs to $OUT, the bench JSONs
# and metrics under $WORK (default /tmp/tiers-work).
# Env: CONFIG, CONCS, NP (prompts per concurrency unit, default 4), IN/OL (512 / 128), BUILD (build-gpu).
set -uo pipefail
OUT=${OUT:-/tmp/tiers}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
CONFIG=${CONFIG:-tests/data/configs/gpt-oss-20b}
CONCS=${CONCS:-"16 64"}
NP=${NP:-4}
IN=${IN:-512}
OL=${OL:-128}
BUILD=${BUILD:-build-gpu}
S="$OUT/tiers.txt"
# Everything but the summary and the servers' logs in a work folder (the device tool returns few files).
W=${WORK:-/tmp/tiers-work}
mkdir -p "$W"
BIN=$BUILD/src/apps/polylora
if [ ! -x "$BIN" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >> "$OUT/build.txt" 2>&1
  ninja -C "$BUILD" -j16 polylora >> "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
  stamp build
fi
D=/tmp/tiers-model
mkdir -p $D
cp "$CONFIG/config.json" $D/
[ -f "$CONFIG/generation_config.json" ] && cp "$CONFIG/generation_config.json" $D/
zcat tests/data/tokenizers/o200k/tokenizer.json.gz > $D/tokenizer.json
A=/tmp/tiers-adapters
if [ ! -f $A/a64/adapter_config.json ]; then
  python3 .device-carry/peers/gen_adapters.py $D $A 8 --rank 16 >> "$W/gen.txt" 2>&1 || { tail "$W/gen.txt"; exit 1; }
  for i in $(seq 9 64); do
    src=$A/a$(( (i - 1) % 8 + 1 ))
    mkdir -p $A/a$i
    for f in "$src"/*; do ln -f "$f" $A/a$i/; done
  done
  stamp "adapters"
fi
mods=""
names=""
for i in $(seq 1 64); do
  mods="$mods a$i=$A/a$i"
  names="$names a$i"
done
# The pinned host-to-device copy rate of this machine, now.
python3 - >> "$S" 2>&1 <<'PY'
import torch, time
x = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
for _ in range(2): y.copy_(x, non_blocking=True)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(5): y.copy_(x, non_blocking=True)
torch.cuda.synchronize()
print("pinned host-to-device copy: %.1f GB/s (1 GiB x 5, torch)" % (5 * (1 << 30) / (time.perf_counter() - t) / 1e9))
PY
PORT=8013
run_mode() {  # label, serve flags...
  local label=$1
  shift
  "$BIN" serve --model $D --load-format dummy --served-model-name base --lora-modules $mods \
    --max-lora-rank 16 --max-num-seqs 256 --max-model-len 4096 --port $PORT "$@" > "$OUT/serve-$label.log" 2>&1 &
  local sp=$!
  for _ in $(seq 1 300); do curl -sf localhost:$PORT/health > /dev/null && break; sleep 1; done
  if ! curl -sf localhost:$PORT/health > /dev/null; then
    tail -30 "$OUT/serve-$label.log"
    kill $sp
    return 1
  fi
  stamp "serve $label up"
  # Warm-up: every adapter used once (resident: all 64 take their slots before the measured runs).
  "$BIN" bench serve --port $PORT --model base --num-prompts 64 --random-input-len 16 --random-output-len 2 \
    --max-concurrency 64 --lora-modules $names --lora-assignment round-robin > "$W/warm-$label.txt" 2>&1
  curl -s localhost:$PORT/metrics | grep -E "^polylora:adapter_(loads|evictions|upload)" > "$W/metrics0-$label.txt"
  for c in $CONCS; do
    local n=$((c * NP))
    [ $n -lt 32 ] && n=32
    "$BIN" bench serve --port $PORT --model base --num-prompts $n --random-input-len $IN --random-output-len $OL \
      --max-concurrency $c --lora-modules $names --lora-assignment random --seed 7 --percentile-metrics ttft,tpot \
      --metric-percentiles 50,99 --save-result --result-dir "$W" --result-filename "$label-c$c.json" \
      > "$W/bench-$label-c$c.txt" 2>&1
    stamp "bench $label c$c"
  done
  curl -s localhost:$PORT/metrics | grep -E "^polylora:adapter_(loads|evictions|upload)" > "$W/metrics1-$label.txt"
  kill $sp
  wait $sp 2> /dev/null
}
run_mode resident --max-loras 64 --max-cpu-loras 64
run_mode tiers --max-loras 8 --max-cpu-loras 64
python3 - "$W" "$CONCS" >> "$S" <<'PY'
import json, os, re, sys
out, concs = sys.argv[1], sys.argv[2].split()
def metrics(path):
    m = {}
    for line in open(path):
        k, v = line.rsplit(" ", 1)
        m[re.sub(r'model_name="[^"]*",?', "", k)] = float(v)
    return m
for c in concs:
    r = {}
    for label in ("resident", "tiers"):
        p = os.path.join(out, f"{label}-c{c}.json")
        if os.path.exists(p):
            r[label] = json.load(open(p))
    for label, j in r.items():
        print(f"{label:8} C={c:>3}: ok {j['completed']}/{j['num_prompts']} OTPS {j['output_throughput']:8.1f} tok/s "
              f"TTFT p50 {j.get('p50_ttft_ms', j.get('median_ttft_ms', 0)):7.1f} ms p99 {j.get('p99_ttft_ms', 0):7.1f} ms "
              f"({j.get('duration', 0):.1f} s)")
    if len(r) == 2:
        a, b = r["resident"], r["tiers"]
        print(f"ratio tiers/resident C={c}: OTPS {b['output_throughput'] / a['output_throughput']:.3f} (goal >= 0.85), "
              f"p99 TTFT {b.get('p99_ttft_ms', 0) / max(a.get('p99_ttft_ms', 1e-9), 1e-9):.2f} (goal <= 2)")
m0, m1 = metrics(os.path.join(out, "metrics0-tiers.txt")), metrics(os.path.join(out, "metrics1-tiers.txt"))
d = {k: m1[k] - m0.get(k, 0) for k in m1}
dur = sum(json.load(open(os.path.join(out, f"tiers-c{c}.json"))).get("duration", 0) for c in concs
          if os.path.exists(os.path.join(out, f"tiers-c{c}.json")))
for k, v in sorted(d.items()):
    print(f"  {k} +{v:g}")
n = d.get("polylora:adapter_upload_seconds_count{}", 0)
if n:
    s, b = d.get("polylora:adapter_upload_seconds_sum{}", 0), d.get("polylora:adapter_upload_bytes_total{}", 0)
    print(f"tiers: {n:g} uploads into device slots in {dur:.1f} s of benchmark ({n / max(dur, 1e-9):.2f} loads/s); "
          f"{s / n * 1e3:.1f} ms and {b / n / 1e6:.1f} MB per adapter swap, {b / max(s, 1e-9) / 1e9:.1f} GB/s")
PY
cat "$S"
