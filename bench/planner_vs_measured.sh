#!/usr/bin/env bash
# The cost model against runs it can be checked on: configs/demo.toml (and
# a wider variant) with a global batch of 32 sequences on 1 and 2 ranks of
# this machine (1 thread each: a "device" of
# configs/hardware/this-machine.toml is one core, and the machine has 2, so
# more ranks would share cores), 14 layouts over dp, tp, pp, ep, cp,
# ZeRO-1, micro-batch and recompute, each trained for STEPS steps (median
# step_s of steps 3+, no snapshots)
# and predicted by `moetron plan --cluster 1xN --device this-machine
# --layout ...`. The profile comes from micro-benchmarks only. Ends with
# the mean absolute error, the worst error and Kendall's tau of the ranking.
#
#   bench/planner_vs_measured.sh --data DIR [--steps 12] [--json FILE] [--device this-machine]
#                                [--moetron build/moetron]
set -euo pipefail
data="" steps=12 json="" moetron="" device=this-machine
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
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

# name ranks plan-layout train-sets... ("wide": d_model 384, 6 heads, wider FFNs)
wide="--set model.d_model=384 --set model.n_heads=6 --set model.ffn_hidden=1024 --set moe.expert_hidden=768"
layouts=(
  "one 1 dp=1,mb=16"
  "one-mb8 1 dp=1,mb=8 --set train.micro_batch=8"
  "one-selective 1 dp=1,mb=16,recompute=selective --set recompute.policy=selective"
  "one-full 1 dp=1,mb=16,recompute=full --set recompute.policy=full"
  "dp2 2 dp=2,mb=16"
  "dp2-zero1 2 dp=2,mb=16,zero1 --set parallel.zero=true"
  "tp2 2 tp=2,mb=16 --set parallel.tp=2"
  "pp2 2 pp=2,mb=16 --set parallel.pp=2"
  "dp2-ep2 2 dp=2,ep=2,mb=16 --set parallel.ep=2"
  "cp2 2 cp=2,mb=16 --set parallel.cp=2"
  "wide-one 1 dp=1,mb=16 $wide"
  "wide-dp2 2 dp=2,mb=16 $wide"
  "wide-tp2 2 tp=2,mb=16 --set parallel.tp=2 $wide"
  "wide-pp2-full 2 pp=2,mb=16,recompute=full --set parallel.pp=2 --set recompute.policy=full $wide"
)
echo "| layout | ranks | predicted step (s) | measured step (s) | predicted / measured | predicted terms (s) |"
echo "|---|---:|---:|---:|---:|---|"
for entry in "${layouts[@]}"; do
  read -r name ranks layout sets <<< "$entry"
  # shellcheck disable=SC2086
  "$moetron" launch -n "$ranks" --threads-per-rank 1 -- train --config "$root/configs/demo.toml" \
    --out "$work/$name" "${common[@]}" $sets > "$work/$name.log" 2>&1 ||
    { echo "run $name failed:" >&2; tail -20 "$work/$name.log" >&2; exit 1; }
  model_sets=()
  if [[ $name == wide-* ]]; then read -r -a model_sets <<< "$wide"; fi
  (cd "$root" && "$moetron" plan --config configs/demo.toml --cluster "1x$ranks" \
    --device "$device" --layout "$layout" --global-batch 32 --json "$work/$name.plan.json" \
    "${model_sets[@]}" > "$work/$name.plan.txt")
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
python3 - "$work/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
err = [r["predicted_s"] / r["measured_s"] - 1 for r in rows]
mae = sum(abs(e) for e in err) / len(err)
worst = max(err, key=abs)
# Kendall tau-a of predicted against measured step times.
conc = disc = 0
for i in range(len(rows)):
    for j in range(i + 1, len(rows)):
        a = (rows[i]["predicted_s"] - rows[j]["predicted_s"]) * (rows[i]["measured_s"] - rows[j]["measured_s"])
        conc += a > 0
        disc += a < 0
tau = (conc - disc) / (len(rows) * (len(rows) - 1) / 2)
print(f"\n{len(rows)} layouts: mean absolute error {100 * mae:.1f}%, worst {100 * worst:+.1f}%, Kendall tau {tau:.3f}")
PY
if [[ -n "$json" ]]; then
  python3 -c 'import json,sys; json.dump([json.loads(l) for l in open(sys.argv[1])], open(sys.argv[2], "w"), indent=2)' \
    "$work/rows.jsonl" "$json"
fi
