#!/usr/bin/env bash
# The cost model against runs it can be checked on: configs/demo.toml with
# a global batch of 32 sequences on 1 and 2 ranks of this machine (1 thread
# each: a "device" of configs/hardware/this-machine.toml is one core), each
# layout trained for STEPS steps (median step_s of steps 3+, no snapshots)
# and predicted by `moetron plan --cluster 1xN --device this-machine
# --layout ...`. The profile comes from micro-benchmarks only.
#
#   bench/planner_vs_measured.sh --data DIR [--steps 12] [--json FILE] [--moetron build/moetron]
set -euo pipefail
data="" steps=12 json="" moetron=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    *) echo "planner_vs_measured.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "planner_vs_measured.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--set data.path="$data" --set train.steps="$steps" --set train.global_batch=32
        --set train.micro_batch=16 --set checkpoint.every=0 --set checkpoint.snapshot_every=0)

# name ranks plan-layout train-sets...
layouts=(
  "one 1 dp=1,mb=16"
  "dp2 2 dp=2,mb=16"
  "tp2 2 tp=2,mb=16 --set parallel.tp=2"
  "pp2 2 pp=2,mb=16 --set parallel.pp=2"
  "dp2-ep2 2 dp=2,ep=2,mb=16 --set parallel.ep=2"
)
echo "| layout | ranks | predicted step (s) | measured step (s) | predicted / measured | predicted terms (s) |"
echo "|---|---:|---:|---:|---:|---|"
for entry in "${layouts[@]}"; do
  read -r name ranks layout sets <<< "$entry"
  # shellcheck disable=SC2086
  "$moetron" launch -n "$ranks" --threads-per-rank 1 -- train --config "$root/configs/demo.toml" \
    --out "$work/$name" "${common[@]}" $sets > "$work/$name.log" 2>&1 ||
    { echo "run $name failed:" >&2; tail -20 "$work/$name.log" >&2; exit 1; }
  (cd "$root" && "$moetron" plan --config configs/demo.toml --cluster "1x$ranks" \
    --device this-machine --layout "$layout" --global-batch 32 --json "$work/$name.plan.json" \
    > "$work/$name.plan.txt")
  python3 - "$work" "$name" "$ranks" <<'PY'
import json, statistics, sys
work, name, ranks = sys.argv[1:4]
lines = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
measured = statistics.median([d["step_s"] for d in lines if d.get("step", 0) >= 3 and "step_s" in d])
plan = json.load(open(f"{work}/{name}.plan.json"))["plans"][0]
terms = ", ".join(f"{k} {v:.3f}" for k, v in plan["seconds"].items() if v > 0.0005)
print(f"| {name} | {ranks} | {plan['step_s']:.3f} | {measured:.3f} | {plan['step_s'] / measured:.2f} | {terms} |")
with open(f"{work}/rows.jsonl", "a") as f:
    f.write(json.dumps({"layout": name, "ranks": int(ranks), "predicted_s": plan["step_s"],
                        "measured_s": measured, "terms": plan["seconds"]}) + "\n")
PY
done
if [[ -n "$json" ]]; then
  python3 -c 'import json,sys; json.dump([json.loads(l) for l in open(sys.argv[1])], open(sys.argv[2], "w"), indent=2)' \
    "$work/rows.jsonl" "$json"
fi
