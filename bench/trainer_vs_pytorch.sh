#!/usr/bin/env bash
# bench-moe three ways in one run, back to back on the same machine (issue
# 24 §1): the real `moetron train` (configs/bench-moe.toml, bf16, one
# process), the step benchmark (`moetron_bench_kernels --filter
# train_step`: forward, backward and AdamW on one fixed batch, no data
# path, no metrics, no checkpoints), and the same model in PyTorch eager
# (bench/pytorch_bench_moe.py: bf16 autocast, AdamW). Each gets the same
# threads; each reports its median step after warm-up and its peak RSS
# (/usr/bin/time's maximum resident set). Prints a table of the ratios the
# issue sets targets on and appends one JSON line per implementation.
#
# PyTorch comes from Debian (python3-torch); with --install-torch this
# script installs it (apt-get, as root) when `import torch` fails. Nothing
# in `make test` needs it.
#
#   bench/trainer_vs_pytorch.sh [--steps 12] [--threads 2] [--rounds 2]
#     [--data DIR] [--install-torch] [--trainer-set KEY=VALUE ...] [--moetron build/moetron]
#     [--bench build/bench/moetron_bench_kernels] [--json FILE]
set -euo pipefail
steps=12 threads=2 rounds=2 data="" install=0 json="" trainer_sets=()
root=$(cd "$(dirname "$0")/.." && pwd)
moetron="$root/build/moetron" bench="$root/build/bench/moetron_bench_kernels"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --install-torch) install=1; shift ;;
    --trainer-set) trainer_sets+=(--set "$2"); shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "trainer_vs_pytorch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for tool in "$moetron" "$bench" /usr/bin/time; do
  [[ -x "$tool" ]] || { echo "trainer_vs_pytorch.sh: $tool not found (make build; apt-get install time)" >&2; exit 2; }
done
# Debian's interpreter: python3-torch installs into its dist-packages.
py=/usr/bin/python3
if ! "$py" -c "import torch" 2>/dev/null; then
  if [[ $install == 1 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch >/dev/null
  else
    echo "trainer_vs_pytorch.sh: $py cannot import torch; rerun with --install-torch (apt-get install python3-torch)" >&2
    exit 2
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z $data ]]; then
  data="$work/data"
  "$moetron" prepare-data --input /usr/share/games/fortunes --out "$data" --vocab-size 8192 >/dev/null
fi
export OMP_NUM_THREADS=$threads

# Peak RSS in MB from /usr/bin/time -v's report.
rss_mb() { awk -F: '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$1"; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

run_trainer() {
  local out="$work/run-$1"
  /usr/bin/time -v -o "$work/time-trainer" "$moetron" train --config "$root/configs/bench-moe.toml" \
    --out "$out" --set train.threads="$threads" --set data.path="$data" \
    --set train.steps=$((steps + 2)) --set train.precision=bf16 "${trainer_sets[@]}" \
    >"$work/trainer.log" 2>&1 || {
    tail -20 "$work/trainer.log" >&2; exit 1; }
  # Steps after the first two (warm-up), as the other two measure.
  local med
  med=$(python3 -c '
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if "\"step_s\"" in l]
print(" ".join(str(s["step_s"]) for s in steps[2:]))' "$out/metrics.jsonl" | tr ' ' '\n' | median)
  echo "$med $(rss_mb "$work/time-trainer")"
}

run_step_bench() {
  /usr/bin/time -v -o "$work/time-bench" "$bench" --filter train_step --threads "$threads" \
    --json "$work/step.json" >"$work/bench.log" 2>&1 || { tail -20 "$work/bench.log" >&2; exit 1; }
  local secs
  secs=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
rs = d["results"] if isinstance(d, dict) else d
print([r for r in rs if r["name"] == "train_step/bench-moe/bf16"][0]["metrics"]["seconds"])' "$work/step.json")
  echo "$secs $(rss_mb "$work/time-bench")"
}

run_pytorch() {
  /usr/bin/time -v -o "$work/time-torch" "$py" "$root/bench/pytorch_bench_moe.py" \
    --steps "$steps" --threads "$threads" --tokens "$data/train.bin" >"$work/torch.json" 2>"$work/torch.log" || {
    tail -20 "$work/torch.log" >&2; exit 1; }
  local secs
  secs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step_seconds_median"])' "$work/torch.json")
  echo "$secs $(rss_mb "$work/time-torch")"
}

tokens=$((8 * 512))
printf '%-6s %-22s %12s %12s %10s\n' round impl "s/step" "tokens/s" "RSS MB"
for ((r = 1; r <= rounds; ++r)); do
  read -r tr_s tr_rss < <(run_trainer "$r")
  read -r sb_s sb_rss < <(run_step_bench)
  read -r pt_s pt_rss < <(run_pytorch)
  for row in "moetron-train $tr_s $tr_rss" "step-benchmark $sb_s $sb_rss" "pytorch-eager $pt_s $pt_rss"; do
    read -r impl s rss <<<"$row"
    tps=$(python3 -c "print(round($tokens / $s, 1))")
    printf '%-6s %-22s %12.3f %12s %10s\n' "$r" "$impl" "$s" "$tps" "$rss"
    if [[ -n $json ]]; then
      printf '{"round":%d,"impl":"%s","step_seconds":%s,"tokens_per_s":%s,"peak_rss_mb":%s,"threads":%d,"steps":%d}\n' \
        "$r" "$impl" "$s" "$tps" "$rss" "$threads" "$steps" >>"$json"
    fi
  done
  python3 - "$tr_s" "$sb_s" "$pt_s" "$tr_rss" "$pt_rss" <<'EOF'
import sys
tr, sb, pt, tr_rss, pt_rss = map(float, sys.argv[1:])
print(f"       trainer / step benchmark rate {sb / tr:.3f} (target >= 0.95); "
      f"trainer vs PyTorch {pt / tr:.2f}x (target >= 5); RSS {tr_rss / pt_rss:.2f} of PyTorch's (target <= 0.33)")
EOF
done
