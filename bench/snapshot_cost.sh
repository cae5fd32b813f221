#!/usr/bin/env bash
# What an in-memory snapshot after every step costs: `moetron launch -n RANKS`
# trains configs/demo.toml for STEPS steps with checkpoint.snapshot_every=1
# (snapshots on /dev/shm) and, alternating in the same rounds, with
# snapshots off (=0), in ABBA order. No disk checkpoint before the end in either. From each
# run's metrics.jsonl (steps 3..STEPS: step 1 warms up, the first two
# snapshots fill fresh pages) it takes the median step time (step_s) and the
# median snapshot time (moetron_snapshot_seconds), and prints per round:
# snapshot / step of the run with snapshots, and the median wall time per
# step (step + snapshot) against the run without.
#
#   bench/snapshot_cost.sh --data DIR [--ranks 4] [--rounds 3] [--steps 20]
#     [--copy other_host|always|off] [--moetron build/moetron] [--json FILE]
set -euo pipefail
data="" ranks=4 rounds=3 steps=20 copy=other_host moetron="" json=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --copy) copy=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "snapshot_cost.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "snapshot_cost.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
(( steps >= 5 )) || { echo "snapshot_cost.sh: --steps must be >= 5" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
shm=$(mktemp -d /dev/shm/moetron-snapshot-bench.XXXXXX)
trap 'rm -rf "$work" "$shm"' EXIT

run() {  # run NAME SNAPSHOT_EVERY
  "$moetron" launch -n "$ranks" --threads-per-rank 1 -- train --config "$root/configs/demo.toml" \
    --out "$work/$1" --set data.path="$data" --set train.steps="$steps" \
    --set checkpoint.every=0 --set checkpoint.snapshot_every="$2" \
    --set checkpoint.snapshot_dir="$shm" --set checkpoint.snapshot_copy="$copy" \
    > "$work/$1.log" 2>&1 || { echo "run $1 failed:" >&2; tail -20 "$work/$1.log" >&2; exit 1; }
}

# ABBA order: a machine drifting slower over the benchmark does not favour
# the runs that come first.
for ((r = 1; r <= rounds; ++r)); do
  if ((r % 2)); then
    run "off-$r" 0
    run "on-$r" 1
  else
    run "on-$r" 1
    run "off-$r" 0
  fi
done

python3 - "$work" "$rounds" "$ranks" "$steps" "$copy" "$json" <<'PY'
import json, statistics, sys
work, rounds, ranks, steps, copy, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]

def read(name):
    step, snap = [], []
    for line in open(f"{work}/{name}/metrics.jsonl"):
        d = json.loads(line)
        if d.get("step", 0) < 3 or "step_s" not in d:
            continue
        s = d["series"].get("moetron_snapshot_seconds", 0.0) if name.startswith("on") else 0.0
        step.append(d["step_s"])
        snap.append(s)
    return step, snap

rows = []
print(f"dp {ranks}, configs/demo.toml, {steps} steps, snapshot every step (copies: {copy}); medians of steps 3..{steps}")
print("| round | step, off (ms) | step, on (ms) | snapshot (ms) | snapshot / step | wall per step on / off |")
print("|---:|---:|---:|---:|---:|---:|")
for r in range(1, rounds + 1):
    off_step, _ = read(f"off-{r}")
    on_step, on_snap = read(f"on-{r}")
    m_off, m_on, m_snap = statistics.median(off_step), statistics.median(on_step), statistics.median(on_snap)
    wall_on = statistics.median([a + b for a, b in zip(on_step, on_snap)])
    row = {"round": r, "step_off_s": m_off, "step_on_s": m_on, "snapshot_s": m_snap,
           "snapshot_share": m_snap / m_on, "wall_ratio": wall_on / m_off}
    rows.append(row)
    print(f"| {r} | {m_off*1e3:.1f} | {m_on*1e3:.1f} | {m_snap*1e3:.1f} | {100*row['snapshot_share']:.2f}% | {row['wall_ratio']:.3f} |")
share = statistics.median([x["snapshot_share"] for x in rows])
wall = statistics.median([x["wall_ratio"] for x in rows])
print(f"median over rounds: snapshot / step {100*share:.2f}% (target < 3%), wall per step with / without {wall:.3f}")
if out:
    json.dump({"ranks": int(ranks), "steps": int(steps), "copy": copy, "rounds": rows,
               "snapshot_share_median": share, "wall_ratio_median": wall}, open(out, "w"), indent=2)
PY
