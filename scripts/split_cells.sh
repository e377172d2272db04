#!/usr/bin/env bash
# ModalShare alone (or POLICIES) on a fixed set of cells of the split grids, with one setting changed against
# the grids' own rows (same protocol: 400 steps, 3 seeds, refreshes every 50 steps, the same floors); the cells
# are fixed here, before any of them runs: the three data sets x random, topk, dct x the grids' second and fourth
# compressions (5x, 20x; COMPRESSIONS="..." for others of the grids').
# Usage: [COMPRESSIONS="5 20"] [POLICIES=modalshare] scripts/split_cells.sh OUT_DIR [jobs] [bench split options...]
#   (a cell whose record exists is skipped)
#   stand-ins:  scripts/split_cells.sh results/cpu/split-absent-mean 2 --absent mean
#   held out:   scripts/split_cells.sh results/cpu/split-heldout 2 --score-on heldout, then with
#               COMPRESSIONS=32 (the grids' highest, added once the first set had run); the other policies
#               that score a batch, likewise, for a comparison on equal terms (added then too):
#               POLICIES=gradient-norm,std COMPRESSIONS="5 20 32" ... results/cpu/split-heldout-others ...;
#               last both again with COMPRESSIONS="2 10" (the grids' other compressions)
#   held out at equal shares (the scoring batch sent at the equal keep-ratios), every cell of the grids:
#               COMPRESSIONS="2 5 10 20 32" scripts/split_cells.sh results/cpu/split-heldout-equal-share 2
#               --score-on heldout --score-at equal; then (added after those had run) --score-at raised into
#               results/cpu/split-heldout-raised-share
set -uo pipefail
out=${1:?output directory}; jobs=${2:-2}; shift $(( $# >= 2 ? 2 : $# ))
mkdir -p "$out"
export SPLIT_CELL_OPTIONS="$*" POLICIES  # bench split options for every cell (no spaces inside one)
# several cells at once: one intra-op thread each unless told otherwise (processes whose thread pools share the
# cores wait on each other's threads: a small reduction then takes milliseconds)
[ "$jobs" -le 1 ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for dataset in synthetic digits spoken-digits; do
  for compressor in random topk dct; do
    for compression in ${COMPRESSIONS:-5 20}; do
      printf '%s %s %s\n' "$dataset" "$compressor" "$compression"
    done
  done
done | xargs -P "$jobs" -L 1 bash -c '
  dataset=$1 compressor=$2 compression=$3
  json="'"$out"'/$dataset-$compressor-$compression.json"
  [ -s "$json" ] && exit 0
  client=(); [ "$dataset" = synthetic ] || client=(--dataset "$dataset" --client conv)
  python3 -m actzip_bench bench split "${client[@]}" --compressor "$compressor" --compression "$compression" \
    --policies "${POLICIES:-modalshare}" $SPLIT_CELL_OPTIONS --json "$json" > "${json%.json}.log" 2>&1 || echo "FAILED $json"
  rm -f "${json%.json}.png"' _
