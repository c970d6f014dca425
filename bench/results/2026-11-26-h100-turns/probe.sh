#!/usr/bin/env bash
# Temporary probe: why the whole call at 4x32x16384x128 pays more over the kernel than the
# preparation alone takes. Runs after gpu.sh's build (BIN given).
BIN="$1"; OUT="$2"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > /tmp/smi.csv 2>&1 &
SMI=$!
one() {  # name shape env...
  local name=$1 shape=$2; shift 2
  echo "== $name $(date -u +%T.%N)" >> /tmp/smi-marks.txt
  env "$@" "$BIN" run --shape "$shape" --dtype bf16 --kernels sage1-int8,sage2-int8-fp8,fa3-fp8 --ref-sample-rows 16 -q \
    --max-noise 1 --timeout 3 --json "/tmp/gap-$name.json" > /dev/null 2>&1 || echo "$name failed"
  python3 - "$name" "/tmp/gap-$name.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
for k in json.load(open(path))["calls"][0]["kernels"]:
    t, w, p = k.get("timing") or {}, k.get("timing_with_preparation") or {}, k.get("timing_of_preparation") or {}
    ms = lambda x: (x or {}).get("median_s", float("nan")) * 1e3
    print(f"{name:14} {k['kernel']:15} kernel {ms(t):8.3f} ({t.get('samples')}, {t.get('sm_clock_median_mhz')} MHz)"
          f" whole {ms(w):8.3f} ({w.get('samples')}, {w.get('sm_clock_median_mhz')} MHz)"
          f" prep {ms(p):7.4f} ({p.get('samples')}, {p.get('sm_clock_median_mhz')} MHz)"
          f" whole-kernel {ms(w) - ms(t):7.3f} ratio {(k.get('preparation') or {}).get('ratio_to_bound')}", flush=True)
PY
}
for round in 1 2; do
  one three-16k-$round 4,32,16384,128 ATTNREPLAY_EXP_THREE_IN_TURNS=1
  one pair-16k-$round 4,32,16384,128 X=1
  one pairafter-16k-$round 4,32,16384,128 ATTNREPLAY_EXP_ATTENTION_AFTER_ALL=1
  one three-4k-$round 4,32,4096,128 ATTNREPLAY_EXP_THREE_IN_TURNS=1
  one pair-4k-$round 4,32,4096,128 X=1
done
kill $SMI
cat /tmp/smi-marks.txt
cp /tmp/smi.csv /tmp/smi-marks.txt "$OUT"/
tar czf "$OUT/gap-json.tgz" -C /tmp $(cd /tmp && ls gap-*.json)
# The power trace, summarised per second.
python3 - <<'PY' > "$OUT/smi-summary.txt"
import collections
rows = [l.split(", ") for l in open("/tmp/smi.csv") if l.count(",") >= 5]
by_sec = collections.OrderedDict()
for r in rows:
    by_sec.setdefault(r[0][:19], []).append(r)
for sec, rs in by_sec.items():
    clocks = sorted(int(r[1].split()[0]) for r in rs)
    power = sorted(float(r[3].split()[0]) for r in rs)
    print(sec, "sm MHz", clocks[0], clocks[len(clocks)//2], clocks[-1], "W", power[len(power)//2], power[-1], "temp", rs[-1][4], "thr", rs[-1][5])
PY
