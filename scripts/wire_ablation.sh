#!/usr/bin/env bash
# Ablations of the learned stage boundaries, one `actzip bench wire` run per variant and seed, at equal tokens (no
# training on past the steps), fresh windows; the protocol is fixed here, before any result is read.
#   paper: the subspace and bottleneck boundaries with each difference from their papers changed alone and all
#          together, dense beside under both optimizers; 16-bit codes (with d = 256 a float32 code at these
#          ratios would be 2 values a token)
#   rvq:   MAPL's residual vector quantization of the Stiefel code against plain 8-bit codes at about the same
#          forward bytes (codebook stream included), both with full-rank anchors, and one change to the RVQ at a
#          time (its dense reference is the paper set's, same protocol)
# Usage: [SEEDS="0 1 2"] [VARIANTS="dense subspace ..."] scripts/wire_ablation.sh SET OUT_DIR [jobs] [extra bench
#   wire options...] (later options win; a variant whose record exists is skipped)
#   CPU:  scripts/wire_ablation.sh paper results/cpu/wire-paper-ablation 2
#   124M: see the wire-paper-ablation stage of scripts/h200_bench.sh
set -uo pipefail
set_name=${1:?set: paper or rvq}; out=${2:?output directory}; jobs=${3:-2}; shift $(( $# >= 3 ? 3 : $# ))
mkdir -p "$out"
bench=(--stages 2 --steps 500 --lr 6e-4 --dataset-windows 0 --target-steps 1 --seed SEED "$@")
full="anchor_rank=256,lr=1e-4"  # the Stiefel boundary's full-rank anchors at d = 256, its slower step
bounded="rvq_max_rows=32,rvq_delta_dtype=bfloat16"  # a codebook stream of at most 32 bfloat16 rows a step
# name | entry | boundary options | optimizer | stage codec [| backward codec]
case $set_name in
  paper) variants=(
    "dense|dense||adamw|"
    "dense-muon|dense||muon|"
    "subspace|subspace:100|code_dtype=bfloat16|adamw|"
    "subspace-fixed1|subspace:100|code_dtype=bfloat16,fixed_std=1.0|adamw|"
    "subspace-zero|subspace:100|code_dtype=bfloat16,proj_init=zero|adamw|"
    "subspace-muon|subspace:100|code_dtype=bfloat16|muon|"
    "subspace-paper|subspace:100|code_dtype=bfloat16,fixed_std=1.0,proj_init=zero|muon|"
    # added after the first seed's results: the two changes that leave the model's scale alone, together
    "subspace-zero-muon|subspace:100|code_dtype=bfloat16,proj_init=zero|muon|"
    # added after all the seeds above: the subspace boundary at full rank (k = d, no compression) with the
    # paper's std-1 fixed embedding and with the default 0.02, so that the std-1 embedding's cost is measured
    # apart from the compression
    "full-fixed1|subspace:1|code_dtype=bfloat16,fixed_std=1.0|adamw|"
    "full-fixed002|subspace:1|code_dtype=bfloat16|adamw|"
    "bottleneck|bottleneck:128|code_dtype=bfloat16|adamw|"
    "bottleneck-muon|bottleneck:128|code_dtype=bfloat16|muon|"
    "bottleneck-resbm|bottleneck:128|code_dtype=bfloat16,style=resbm|adamw|"
    "bottleneck-paper|bottleneck:128|code_dtype=bfloat16,style=resbm|muon|"
  ) ;;
  rvq) variants=(
    "stiefel-8bit|stiefel:28|$full|adamw|quant:bits=8"
    "stiefel-rvq|stiefel-rvq:100|$full,code_dtype=bfloat16|adamw|"
    # the first seed showed the default codebook stream costing several times the indices at this batch (2,048
    # tokens a step), so every variant from here bounds it: 32 rows a publication, in bfloat16
    "stiefel-rvq-bounded|stiefel-rvq:100|$full,code_dtype=bfloat16,$bounded|adamw|"
    "stiefel-rvq-bounded-w8|stiefel-rvq:100|$full,code_dtype=bfloat16,$bounded,width=8|adamw|"
    "stiefel-rvq-bounded-k16|stiefel-rvq:100|$full,code_dtype=bfloat16,$bounded,rvq_codebook_size=16|adamw|"
    # added after all of those: the best RVQ variant with its code gradients in 8 bits, as the 8-bit entry's are
    "stiefel-rvq-bounded-k16-bwd8|stiefel-rvq:100|$full,code_dtype=bfloat16,$bounded,rvq_codebook_size=16|adamw||quant:bits=8"
  ) ;;
  *) echo "unknown set $set_name (paper or rvq)" >&2; exit 2 ;;
esac
for seed in ${SEEDS:-0 1 2}; do
  for v in "${variants[@]}"; do
    fields=${v//[^|]/}; [ ${#fields} -eq 4 ] && v="$v|"  # no backward codec: the forward's
    [ -z "${VARIANTS:-}" ] || [[ " $VARIANTS " == *" ${v%%|*} "* ]] && printf '%s|%s\n' "$v" "$seed"
  done
done | xargs -P "$jobs" -I{} bash -c '
  IFS="|" read -r name entry opts optim codec bwd seed <<< "$1"; shift
  args=("${@//SEED/$seed}")
  [ -s "'"$out"'/$name-s$seed.json" ] && exit 0   # done by an earlier call
  python3 -m actzip_bench bench wire --compressors "$entry" ${opts:+--boundary "$opts"} --optimizer "$optim" \
    ${codec:+--stage-codec "$codec"} ${bwd:+--bwd-codec "$bwd"} "${args[@]}" --json "'"$out"'/$name-s$seed.json" \
    > "'"$out"'/$name-s$seed.log" 2>&1 || echo "FAILED $name-s$seed"
  rm -f "'"$out"'/$name-s$seed.png"' _ {} "${bench[@]}"
