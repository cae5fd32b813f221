#!/usr/bin/env bash
# Multi-task balancing and modality-aware routing compared on the multimodal
# demo model (configs/multimodal-demo.toml), issue 21's two comparisons:
#
#   balancing  multitask.balance = fixed | uncertainty | gradnorm | dwa, same
#              steps: the spread over the tasks of the steps each needs to close
#              half (and 90%) of its initial-to-final loss gap
#   routing    moe.modality_routing = shared | prior | partitioned (adaptive
#              allocation every 100 steps), 8 experts top-2 in all three (equal
#              steps and FLOPs): per-task final losses, the steps each needs to
#              reach the shared router's final losses, per-modality expert-load
#              entropy, collapse events and allocation moves
#   text       the same model trained on text alone (multimodal.mix = text:1),
#              at the same steps and at the mix's text rows, whose lm loss the
#              demo mix's ("fixed") is compared with
#
# Each run is a real `moetron train` on one process; after it `moetron eval`
# scores every task on its first --examples validation records (captions on
# the held-out split too). bench/multimodal_curves.py reads the runs'
# metrics.jsonl.
#
#   bench/multimodal_compare.sh --data DIR [--compare "balancing routing text"]
#     [--steps 1000] [--seeds "1"] [--examples 100] [--threads 2]
#     [--keep-runs DIR] [--json-prefix PREFIX] [--moetron build/moetron]
#
# DIR: a corpus from `moetron prepare-data --multimodal --n-mels 40` (the demo's
# mel bins). --json-prefix P writes P-balancing-seedS.json and
# P-routing-seedS.json (curves) and P-eval.jsonl (task metrics per run).
set -euo pipefail
data="" compare="balancing routing text" steps=1000 seeds="1" examples=100 threads=2
keep="" json_prefix="" moetron=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --compare) compare=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --examples) examples=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --keep-runs) keep=$2; shift 2 ;;
    --json-prefix) json_prefix=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    *) echo "multimodal_compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "multimodal_compare.sh: --data DIR (a multimodal corpus) is required" >&2; exit 2; }
[[ -f "$data/manifest.json" ]] || { echo "multimodal_compare.sh: '$data' has no manifest.json (run prepare-data --multimodal)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ -n "$keep" ]]; then
  work=$keep; mkdir -p "$work"
else
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fi
eval_out=${json_prefix:+$json_prefix-eval.jsonl}
[[ -z "$eval_out" ]] || : > "$eval_out"

# train NAME SEED [--set k=v ...]: one run into $work/NAME-sSEED, then its task metrics.
train() {
  local name=$1 seed=$2; shift 2
  local dir=$work/$name-s$seed
  rm -rf "$dir"
  echo "== $name, seed $seed: $steps steps" >&2
  local start=$SECONDS
  OMP_NUM_THREADS=$threads "$moetron" train --config "$root/configs/multimodal-demo.toml" \
    --out "$dir" --set multimodal.data="$data" --set train.steps="$steps" \
    --set train.seed="$seed" --set train.threads="$threads" --set train.eval_every="$steps" \
    --set checkpoint.every="$steps" --set checkpoint.keep=1 "$@" > "$dir.log" 2>&1 \
    || { echo "multimodal_compare.sh: $name failed, see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
  echo "   $(tail -1 "$dir.log") ($((SECONDS - start)) s)" >&2
  local spec task split
  for spec in caption:heldout caption:val ocr:val asr:val lm:val; do
    task=${spec%%:*} split=${spec##*:}
    local json
    json=$("$moetron" eval --checkpoint "$dir" --task "$task" --split "$split" \
      --examples "$examples" 2>/dev/null | tail -1)
    python3 - "$name" "$seed" "$json" <<'EOF' | tee -a "${eval_out:-/dev/null}" >&2
import json, sys
name, seed, line = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d = json.loads(line)
d.pop("first", None)
print(json.dumps({"run": name, "seed": seed, **d}))
EOF
  done
}

for seed in $seeds; do
  for what in $compare; do
    case "$what" in
      balancing)
        specs=()
        for b in fixed uncertainty gradnorm dwa; do
          train "$b" "$seed" --set multitask.balance=$b
          specs+=("$b=$work/$b-s$seed")
        done
        echo "## balancing, seed $seed"
        python3 "$root/bench/multimodal_curves.py" balancing "${specs[@]}" \
          ${json_prefix:+--json "$json_prefix-balancing-seed$seed.json"} ;;
      routing)
        specs=()
        for r in shared prior partitioned; do
          extra=(--set moe.num_experts=8 --set moe.modality_routing=$r)
          [[ $r != partitioned ]] || extra+=(--set moe.modality_realloc_every=100)
          train "route-$r" "$seed" "${extra[@]}"
          specs+=("$r=$work/route-$r-s$seed")
        done
        echo "## routing, seed $seed"
        python3 "$root/bench/multimodal_curves.py" routing "${specs[@]}" --reference shared \
          ${json_prefix:+--json "$json_prefix-routing-seed$seed.json"} ;;
      text)
        # The text-only model (every row text) at the same steps, and at the
        # steps that give it the text rows the mix's runs saw (the mix's text
        # share of the steps): its lm loss against the demo mix's (the
        # balancing comparison's "fixed" run).
        train text-only "$seed" --set multimodal.mix=text:1
        share=$(python3 -c 'import sys, tomllib
mix = tomllib.load(open(sys.argv[1], "rb"))["multimodal"]["mix"]
w = {k: float(v) for k, v in (e.split(":") for e in mix.split(","))}
print(w.get("text", 0) / sum(w.values()))' "$root/configs/multimodal-demo.toml")
        text_steps=$(python3 -c "print(max(1, round($steps * $share)))")
        steps_all=$steps steps=$text_steps
        train text-only-equal-tokens "$seed" --set multimodal.mix=text:1
        steps=$steps_all ;;
      *) echo "multimodal_compare.sh: --compare takes balancing, routing and/or text, got '$what'" >&2; exit 2 ;;
    esac
  done
done
