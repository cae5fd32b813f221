#!/usr/bin/env bash
# Mixed-precision memory modes against fp32 training, over seeds: `moetron
# train` runs configs/demo.toml (16 x 128 tokens per step, one rank) for
# STEPS steps per (seed, optimizer, mode) and reports the final validation
# loss (mean and spread over seeds, and against the fp32 runs) beside the
# allocator's peaks the run reported (metrics.jsonl's last record: params,
# grads, optimizer, total) and its resident memory, so each choice's loss
# cost sits beside its memory saving.
# The total-peak saving on the long-sequence bench-moe is measured by
# `moetron_bench_kernels --filter memory_precision` (bench/RESULTS.md).
#
# Modes (each a set of --set overrides):
#   fp32        fp32 weights, gradients, masters and moments
#   bf16        bf16 working copy with fp32 masters, gradients and moments
#   bf16_gm     bf16 + bf16 hidden-matrix gradients + bf16 moments
#   bf16_all    bf16_gm + bf16 masters (the working copy is the master,
#               stochastically rounded): no fp32 copy of a bf16 parameter
#   bf16_q8     bf16_all with 8-bit moments (optim.moment_dtype = int8:
#               block-wise codes, one fp32 scale per 256 values)
#   bf16_q8f    bf16_q8 with each matrix's second moment factored into row
#               and column averages (optim.second_moment = factored)
#
#   bench/precision_recipe.sh --data DIR [--steps 500] [--seeds "1 2 3"]
#     [--optimizers "adamw muon"] [--modes "fp32 bf16 bf16_gm bf16_all"]
#     [--threads 2] [--keep-runs DIR] [--moetron build/moetron] [--json FILE]
set -euo pipefail
data="" steps=500 seeds="1 2 3" optimizers="adamw" modes="fp32 bf16 bf16_gm bf16_all"
threads=2 moetron="" json="" keep=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --optimizers) optimizers=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --keep-runs) keep=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "precision_recipe.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "precision_recipe.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ -n "$keep" ]]; then
  work=$keep; mkdir -p "$work"
else
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fi

mode_sets() {
  case "$1" in
    fp32) echo "train.precision=fp32" ;;
    bf16) echo "train.precision=bf16" ;;
    bf16_gm) echo "train.precision=bf16 train.grad_dtype=bf16 optim.moment_dtype=bf16" ;;
    bf16_all) echo "train.precision=bf16 train.grad_dtype=bf16 optim.moment_dtype=bf16 optim.master_dtype=bf16" ;;
    bf16_q8) echo "train.precision=bf16 train.grad_dtype=bf16 optim.moment_dtype=int8 optim.master_dtype=bf16" ;;
    bf16_q8f) echo "train.precision=bf16 train.grad_dtype=bf16 optim.moment_dtype=int8 optim.master_dtype=bf16 optim.second_moment=factored" ;;
    *) echo "precision_recipe.sh: unknown mode '$1'" >&2; exit 2 ;;
  esac
}

for seed in $seeds; do
  for opt in $optimizers; do
    for mode in $modes; do
      name="$opt-$mode-s$seed"
      [[ -f "$work/$name/done" ]] && continue  # a kept run already finished
      rm -rf "$work/$name"
      sets=(--set data.path="$data" --set train.steps="$steps" --set train.seed="$seed"
            --set optim.name="$opt" --set train.threads="$threads" --set train.eval_every=100
            --set checkpoint.every=0 --set train.log_every=50)
      for s in $(mode_sets "$mode"); do sets+=(--set "$s"); done
      echo "== $name" >&2
      "$moetron" train --config "$root/configs/demo.toml" --out "$work/$name" "${sets[@]}" \
        > "$work/$name.log" 2>&1 ||
        { echo "run $name failed:" >&2; tail -20 "$work/$name.log" >&2; exit 1; }
      touch "$work/$name/done"
    done
  done
done

python3 - "$work" "$steps" "$seeds" "$optimizers" "$modes" "$json" <<'PY'
import json, statistics, sys
work, steps = sys.argv[1], int(sys.argv[2])
seeds, optimizers, modes, out = sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split(), sys.argv[6]

def run(opt, mode, seed):
    lines = [json.loads(l) for l in open(f"{work}/{opt}-{mode}-s{seed}/metrics.jsonl")]
    val = [l["val_loss"] for l in lines if "val_loss" in l and l["step"] == steps]
    tok = [l["tokens_per_s"] for l in lines if "tokens_per_s" in l]
    series = lines[-1]["series"]
    mem = {tag: series[f'moetron_memory_peak_bytes{{tag="{tag}"}}'] / 2**20
           for tag in ("params", "grads", "optimizer", "total")}
    mem["resident"] = series["moetron_process_resident_bytes"] / 2**20
    return {"val_loss": val[-1], "tokens_per_s": statistics.median(tok) if tok else None,
            "memory_mib": mem}

rows = []
for opt in optimizers:
    base = [run(opt, "fp32", s) for s in seeds] if "fp32" in modes else None
    base_loss = statistics.mean(r["val_loss"] for r in base) if base else None
    for mode in modes:
        rs = [run(opt, mode, s) for s in seeds]
        losses = [r["val_loss"] for r in rs]
        mean = statistics.mean(losses)
        rows.append({"optimizer": opt, "mode": mode, "sets": mode, "steps": steps, "seeds": seeds,
                     "val_loss": losses, "val_loss_mean": mean,
                     "val_loss_spread": max(losses) - min(losses),
                     "vs_fp32": (mean / base_loss - 1) if base_loss else None,
                     "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs
                                                       if r["tokens_per_s"] is not None),
                     "memory_mib": rs[0]["memory_mib"]})

print("| optimizer | mode | val loss per seed | mean | spread | vs fp32 | tokens/s (median) "
      "| params + grads + optimizer MiB | total peak MiB | resident MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    m = r["memory_mib"]
    vs = "—" if r["mode"] == "fp32" or r["vs_fp32"] is None else f"{100 * r['vs_fp32']:+.2f}%"
    print(f"| {r['optimizer']} | {r['mode']} | {' / '.join(f'{v:.4f}' for v in r['val_loss'])} | "
          f"{r['val_loss_mean']:.4f} | {r['val_loss_spread']:.4f} | {vs} | {r['tokens_per_s']:.0f} | "
          f"{m['params']:.1f} + {m['grads']:.1f} + {m['optimizer']:.1f} | {m['total']:.1f} | "
          f"{m['resident']:.0f} |")
if out:
    with open(out, "w") as f:
        for r in rows: f.write(json.dumps(r) + "\n")
PY
