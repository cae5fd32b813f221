#!/usr/bin/env bash
# Gradient compression recipes against uncompressed training, over seeds:
# `moetron launch -n RANKS` trains configs/demo.toml (global batch 16 x 128
# tokens, dp = RANKS) for STEPS steps per (seed, optimizer, recipe) and
# reports the final validation loss (mean and spread over seeds, and against
# the uncompressed runs) and the gradient bytes each rank sent per step,
# from the communicator's counters (metrics.jsonl's grad_bytes_sent): the
# median over compressed steps and the mean over the whole run (warm-up
# included), each as "fewer bytes" against the uncompressed runs' median.
#
# Recipes (each a set of --set overrides):
#   none         fp32 all-reduce
#   onebit       sparse_sign (1 bit per value for 3/4 of the blocks) with error
#                feedback, started automatically, AdamW's variance frozen then
#   onebit_all   the same with every block sent (sign), for comparison
#   onebit_pre   onebit with the error feedback and encoding in AdamW's update
#                space (parallel.compression_space = "preconditioned")
#   sign_pre     onebit_pre with every block sent (sign)
#   int8_pre     onebit_pre's schedule and frozen variance with int8 (control:
#                what freezing costs with a nearly exact encoding)
#   live_pre     onebit_pre with AdamW's second moment live (not frozen): the
#                scales follow v at every step
#   precond      live_pre with 128-value blocks (0.945 bits per value, 33.9x):
#                the recipe RESULTS.md reports over seeds
#   sparse_auto  onebit without freezing the variance
#   int4         int4 with error feedback from step 1 (the earlier baseline)
#
#   bench/compression_recipe.sh --data DIR [--ranks 4] [--steps 500]
#     [--seeds "1 2 3"] [--optimizers "adamw muon"] [--recipes "none onebit"]
#     [--keep-runs DIR] [--moetron build/moetron] [--json FILE]
#     [--extra "key=value ..."  --tag NAME]   (more --set overrides for every
#                                               run; NAME suffixes the run names)
set -euo pipefail
data="" ranks=4 steps=500 seeds="1 2 3" optimizers="adamw muon" recipes="none onebit"
moetron="" json="" keep="" extra="" tag=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --optimizers) optimizers=$2; shift 2 ;;
    --recipes) recipes=$2; shift 2 ;;
    --keep-runs) keep=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --extra) extra=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    *) echo "compression_recipe.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "compression_recipe.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [[ -n "$keep" ]]; then
  work=$keep; mkdir -p "$work"
else
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fi

recipe_sets() {
  case "$1" in
    none) echo "parallel.compression=none" ;;
    onebit) echo "parallel.compression=sparse_sign parallel.compression_start=auto parallel.freeze_variance=true" ;;
    onebit_all) echo "parallel.compression=sign parallel.compression_start=auto parallel.freeze_variance=true" ;;
    onebit_pre) echo "parallel.compression=sparse_sign parallel.compression_start=auto parallel.freeze_variance=true parallel.compression_space=preconditioned" ;;
    sign_pre) echo "parallel.compression=sign parallel.compression_start=auto parallel.freeze_variance=true parallel.compression_space=preconditioned" ;;
    int8_pre) echo "parallel.compression=int8 parallel.compression_start=auto parallel.freeze_variance=true parallel.compression_space=preconditioned" ;;
    precond) echo "parallel.compression=sparse_sign parallel.compression_block=128 parallel.compression_start=auto parallel.compression_space=preconditioned" ;;
    live_pre) echo "parallel.compression=sparse_sign parallel.compression_start=auto parallel.compression_space=preconditioned" ;;
    sparse_auto) echo "parallel.compression=sparse_sign parallel.compression_start=auto" ;;
    int4) echo "parallel.compression=int4" ;;
    *) echo "compression_recipe.sh: unknown recipe '$1'" >&2; exit 2 ;;
  esac
}

for seed in $seeds; do
  for opt in $optimizers; do
    for recipe in $recipes; do
      name="$opt-$recipe${tag:+-$tag}-s$seed"
      [[ -f "$work/$name/done" ]] && continue  # a kept run already finished
      rm -rf "$work/$name"
      sets=(--set data.path="$data" --set train.steps="$steps" --set train.global_batch=16
            --set train.micro_batch=4 --set train.seed="$seed" --set optim.name="$opt"
            --set train.eval_every=100 --set checkpoint.every=0 --set train.log_every=50)
      for s in $(recipe_sets "$recipe") $extra; do sets+=(--set "$s"); done
      echo "== $name" >&2
      "$moetron" launch -n "$ranks" --threads-per-rank 1 -- train --config "$root/configs/demo.toml" \
        --out "$work/$name" "${sets[@]}" > "$work/$name.log" 2>&1 ||
        { echo "run $name failed:" >&2; tail -20 "$work/$name.log" >&2; exit 1; }
      touch "$work/$name/done"
    done
  done
done

python3 - "$work" "$steps" "$ranks" "$seeds" "$optimizers" "$recipes" "$json" "$tag" "$extra" <<'PY'
import json, statistics, sys
work, steps, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seeds, optimizers, recipes, out = sys.argv[4].split(), sys.argv[5].split(), sys.argv[6].split(), sys.argv[7]
tag, extra = sys.argv[8], sys.argv[9]
suffix = f"-{tag}" if tag else ""

def run(opt, recipe, seed):
    lines = [json.loads(l) for l in open(f"{work}/{opt}-{recipe}{suffix}-s{seed}/metrics.jsonl")]
    val = [l["val_loss"] for l in lines if "val_loss" in l and l["step"] == steps]
    sent = [l["grad_bytes_sent"] for l in lines]
    packed = [l["grad_bytes_sent"] for l in lines if l.get("compressed")]
    start = next((l["step"] for l in lines if l.get("compressed")), None)
    return {"val_loss": val[-1], "mean_bytes": statistics.mean(sent),
            "median_bytes": statistics.median(packed or sent), "compressed_from": start}

rows = []
for opt in optimizers:
    base = [run(opt, "none", s) for s in seeds] if "none" in recipes else None
    base_loss = statistics.mean(r["val_loss"] for r in base) if base else None
    base_bytes = statistics.median(r["median_bytes"] for r in base) if base else None
    for recipe in recipes:
        rs = [run(opt, recipe, s) for s in seeds]
        losses = [r["val_loss"] for r in rs]
        mean = statistics.mean(losses)
        row = {"optimizer": opt, "recipe": recipe + suffix, "extra": extra, "ranks": ranks,
               "steps": steps, "seeds": seeds,
               "val_loss": losses, "val_loss_mean": mean,
               "val_loss_spread": max(losses) - min(losses),
               "vs_none": (mean / base_loss - 1) if base_loss else None,
               "compressed_from": [r["compressed_from"] for r in rs],
               "bytes_per_step_compressed": statistics.median(r["median_bytes"] for r in rs),
               "bytes_per_step_run": statistics.mean(r["mean_bytes"] for r in rs)}
        if base_bytes:
            row["fewer_bytes_compressed"] = base_bytes / row["bytes_per_step_compressed"]
            row["fewer_bytes_run"] = base_bytes / row["bytes_per_step_run"]
        rows.append(row)

print("| optimizer | recipe | val loss per seed | mean | spread | vs none | compressed from step | MB/step compressed | fewer bytes | MB/step whole run | fewer bytes |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    vs = "—" if r["recipe"] == "none" + suffix or r["vs_none"] is None else f"{100 * r['vs_none']:+.2f}%"
    print(f"| {r['optimizer']} | {r['recipe']} | {' / '.join(f'{v:.4f}' for v in r['val_loss'])} | "
          f"{r['val_loss_mean']:.4f} | {r['val_loss_spread']:.4f} | {vs} | "
          f"{', '.join(str(s) for s in r['compressed_from'])} | "
          f"{r['bytes_per_step_compressed'] / 1e6:.3f} | {r.get('fewer_bytes_compressed', 1):.1f}x | "
          f"{r['bytes_per_step_run'] / 1e6:.3f} | {r.get('fewer_bytes_run', 1):.1f}x |")
if out:
    with open(out, "w") as f:
        for r in rows: f.write(json.dumps(r) + "\n")
PY
