#!/usr/bin/env bash
# What monitoring costs: trains bench-moe at dp 2 on 2 ranks with the
# registry off, on (per-layer statistics never), and on with per-layer
# statistics and update norms every step, in rounds (off, on, layers; off,
# on, layers; ...) so machine noise hits all three alike; prints each
# mode's median step time (steps 2..N of every round) and its overhead
# against "off". Then counts the distinct series of a 4-rank run.
#
#   bench/monitor_overhead.sh --data DIR [--vocab 8192] [--steps 8] [--rounds 3] [--json FILE]
set -euo pipefail
data="" vocab=8192 steps=8 rounds=3 json=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "monitor_overhead.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "monitor_overhead.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
export OMP_NUM_THREADS=1
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A mode_sets=(
  [off]="--set monitor.enabled=false"
  [on]="--set monitor.layer_stats_every=0"
  [layers]="--set monitor.layer_stats_every=1 --set monitor.update_stats=true"
)
common=(--config "$root/configs/bench-moe.toml" --set data.path="$data" --set model.vocab_size="$vocab"
        --set train.steps="$steps" --set train.eval_batches=1 --set train.threads=1)
for ((r = 1; r <= rounds; r++)); do
  for mode in off on layers; do
    out="$work/$mode-$r"
    # shellcheck disable=SC2086
    mpirun -np 2 --bind-to none "$root/build/moetron" train "${common[@]}" --out "$out" \
      ${mode_sets[$mode]} > "$work/$mode-$r.log" 2>&1 || { cat "$work/$mode-$r.log" >&2; exit 1; }
  done
done
rm -rf "$work/series4"
mpirun -np 4 --oversubscribe --bind-to none "$root/build/moetron" train "${common[@]}" \
  --out "$work/series4" --set train.steps=3 --set train.micro_batch=2 \
  --set monitor.layer_stats_every=1 --set monitor.update_stats=true > "$work/series4.log" 2>&1 ||
  { cat "$work/series4.log" >&2; exit 1; }
python3 - "$work" "$rounds" "$json" <<'PY'
import json, statistics, sys
work, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def steps(mode):
    t = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{work}/{mode}-{r}/metrics.jsonl")]
        t += [x["step_s"] for x in rows if x["step"] >= 2]
    return t
med = {m: statistics.median(steps(m)) for m in ("off", "on", "layers")}
last = [json.loads(l) for l in open(f"{work}/series4/metrics.jsonl")][-1]
series = len(last["series"])
res = {"bench": "monitor_overhead", "dp": 2, "rounds": rounds,
       "step_s": med, "overhead_on_pct": 100 * (med["on"] / med["off"] - 1),
       "overhead_layers_every_step_pct": 100 * (med["layers"] / med["off"] - 1),
       "series_4_ranks": series}
print(f"{'mode':<34}{'median step (s)':>16}{'overhead':>10}")
for m, label in (("off", "registry off"), ("on", "registry on"),
                 ("layers", "on + layer stats every step")):
    print(f"{label:<34}{med[m]:>16.4f}{100 * (med[m] / med['off'] - 1):>9.2f}%")
print(f"distinct series, bench-moe on 4 ranks: {series}")
print(json.dumps(res))
if out:
    open(out, "w").write(json.dumps(res) + "\n")
PY
