#!/usr/bin/env bash
# The long-sequence issue's retrieval probe: the same small model
# (bench/retrieval-8k.toml) trained through the same curriculum of sequence
# lengths on key-retrieval examples, once with both layers local
# (attention.layer_pattern = "LL") and once with the second layer global
# ("LG"); then `moetron eval --task retrieval` on held-out examples of the
# last length. Each stage starts from the previous stage's weights
# (train.init_from) with a fresh optimizer and schedule, and counts the loss
# on the answer only (data.loss_on_answers): a copy circuit forms at 128
# tokens in a minute, where at 8K from scratch it did not form in 1500 steps.
# Lengths double from 1024 on: a model trained at L retrieved at 2L without
# training (99%) but not at 4L (5%), so each stage starts where the last
# one still works (bench/RESULTS.md).
# The window of the local layer is below every stage's key-to-query
# distance, so window-only cannot see the key from the query and should stay
# near chance (1 / key vocabulary); the hybrid's global layer can carry it.
#
#   bench/retrieval_window_vs_hybrid.sh [--stages "128:32:32:1000:1e-2 ..."] [--key-len 1]
#     [--key-within 16] [--patterns "LL LG"] [--threads 2] [--json FILE]
#
# A stage is seq_len:window:micro_batch:steps:lr.
set -euo pipefail
stages="128:32:32:300:1e-2 1024:256:8:300:1e-2 2048:256:4:100:1e-3 4096:256:2:300:1e-3 8192:256:1:400:1e-3"
key_len=1 key_within=16 patterns="LL LG" threads=2 json="" moetron=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stages) stages=$2; shift 2 ;;
    --key-len) key_len=$2; shift 2 ;;
    --key-within) key_within=$2; shift 2 ;;
    --patterns) patterns=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    *) echo "retrieval_window_vs_hybrid.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for stage in $stages; do
  IFS=: read -r seq window mb steps lr <<<"$stage"
  if [[ -z "$lr" ]] || ((window >= seq)); then
    echo "retrieval_window_vs_hybrid.sh: stage '$stage' is not seq_len:window:micro_batch:steps:lr" \
      "with window < seq_len" >&2
    exit 2
  fi
  [[ -d "$work/data-$seq" ]] || "$moetron" prepare-data --task retrieval --seq-len "$seq" \
    --examples 2048 --key-len "$key_len" --key-within "$key_within" --out "$work/data-$seq" >/dev/null
done
printf '%-8s %-28s %10s %10s %9s %12s\n' pattern "last stage (seq:window:mb:steps:lr)" \
  answer_loss accuracy chance "s/step last"
[[ -n "$json" ]] && : > "$json"
for pattern in $patterns; do
  from=""
  total_s=0
  for stage in $stages; do
    IFS=: read -r seq window mb steps lr <<<"$stage"
    run="$work/run-$pattern-$seq"
    init=()
    [[ -n "$from" ]] && init=(--set "train.init_from=$from")
    start=$(date +%s)
    "$moetron" train --config "$root/bench/retrieval-8k.toml" --out "$run" \
      --set "data.path=$work/data-$seq" --set "train.seq_len=$seq" --set "model.max_seq_len=$seq" \
      --set "attention.window=$window" --set "attention.layer_pattern=$pattern" \
      --set "train.micro_batch=$mb" --set "train.steps=$steps" --set "optim.lr=$lr" \
      --set "checkpoint.every=$steps" --set "train.threads=$threads" "${init[@]}" \
      >"$work/train-$pattern-$seq.log" 2>&1 || { cat "$work/train-$pattern-$seq.log" >&2; exit 1; }
    total_s=$((total_s + $(date +%s) - start))
    from="$run"
  done
  score=$("$moetron" eval --task retrieval --checkpoint "$from" --data "$work/data-$seq")
  python3 - "$pattern" "$stage" "$stages" "$total_s" "$from/metrics.jsonl" "$score" "$json" <<'PY'
import json, sys
pattern, stage, stages, total_s, metrics, score, out = sys.argv[1:8]
lines = [json.loads(l) for l in open(metrics) if '"loss"' in l and '"step"' in l]
s = json.loads(score)
step_s = sorted(l.get("step_s", 0) for l in lines[1:])
med = step_s[len(step_s) // 2] if step_s else 0
print(f"{pattern:<8} {stage:<28} {lines[-1]['loss']:>10.4f} {s['accuracy']:>10.4f} {s['chance']:>9.4f} {med:>12.2f}")
if out:
    with open(out, "a") as f:
        f.write(json.dumps({"pattern": pattern, "stages": stages.split(), "final_answer_loss": lines[-1]["loss"],
                            "median_step_s_last_stage": med, "total_train_s": int(total_s), **s}) + "\n")
PY
done
