#!/usr/bin/env bash
# Every GPU figure in results/: run on the device machine from the repository root, with PYTHONPATH=src.
# Usage: scripts/h200_bench.sh OUT_DIR [stage...]
#   stages: tests kernels ffn gpt bits demo quant cache lora wire (default: all; more than 10 minutes in all),
#   ffn-fp8, ffn16k (two runs of the ffn sweep), lora-variants (CARE with extra sketch columns and a power
#   iteration), lora-constant (the constant learning rate, for the spread it gives), cache-wide (the lossy cache
#   at d=4096), cache-chunk1024 (the 124M models with 1024-token loss chunks), cache-2bit (the 2bit preset at
#   both widths), wire-anchors (stiefel with full-rank anchors, 124M), wire-nccl (2 GPUs), wire-lr (a
#   learning-rate sweep per entry, 124M, three runs at once on the one GPU: losses only, their times are
#   not clean; wire-lr-low, wire-lr-lowest and wire-lr-floor the lower rates), wire-best (each entry at
#   its best rate from the sweeps, alone: the time figures), wire-long and wire-long-more (1200 steps at
#   those rates), wire-seeds (the best rates from two more seeds),
#   wire-ratios (stiefel at 4x and 8x), wire-vstep (the stiefel boundary's own cost: frozen and slower
#   projections, k = d), wire-tie (one projection for both ends), wire-stage-lr (the stage after the boundary at a
#   fraction of the rate), wire-stage-lr-more (more base rates and factors), wire-long-stage-lr (1200 steps
#   with the best factors), wire-code-bits (8-bit codes of 4x the width at the same bytes), wire-long-code-bits
#   (1200 steps of those), wire-long-code-bits-lr (the same at higher rates, and dense beside them),
#   wire-longer-code-bits (1800 steps), wire-longest-code-bits (2400),
#   wire-4800-dense and wire-4800-stiefel (4800 steps, one alone per call), wire-long-context (anchors that
#   embed the token before each position too, and dense plus the same anchors), wire-long-context-seed1 and
#   wire-long-context-16x (the same under seed 1; about 16x with those anchors), wire-long-context-16x-seed1,
#   wire-longest-context (2400 steps of the 107x entry with those anchors, and of its control), recheck-memory,
#   recheck-cache and recheck-wire (short subsets of earlier runs, to compare with them), wire-baselines-time and
#   wire-baselines (float32, bf16, 8-bit, 4-bit and delta dense beside the compressed boundaries, seeds 0-2),
#   decentralized-wide-speed and decentralized-wide-loss (bench decentralized at a wire-dominated shape: step
#   times alone, then seeds 0-2 side by side to dense's loss; join them with --merge ... --speed),
#   decentralized-wide-loss-alone (the loss runs one seed after the other, each alone: their own step times),
#   decentralized-wide-loss-s2-continual (the continual runs seed 2 lacks), decentralized-shaped-gpu (the
#   4-bit data-parallel sync on a shaped link with the GPU computing; after netns-probe),
#   decentralized-unshaped-gpu (the same runs on one host), decentralized-wide-shaped-s0 (-s1, -s2: the wide
#   shape's 4-bit-sync methods on the shaped link, dense off it; after netns-probe),
#   cache-host-cost (the cache's host time per save on the GPU), cache-norms and cache-norms-wide (the lossy
#   strategies beside the same with norm outputs rebuilt, 124M and d=4096), cache-loss-124m (4bit and 2bit
#   against bf16 over 2000 steps at 124M, seeds 0-2), cache-compile-graphs and cache-compile-graphs-wide (the
#   compiled step with the codec fused and the graphs replayed as CUDA graphs, beside plain inductor; 124M and
#   d=4096), cache-graphs (every strategy's eager step captured as a CUDA graph, 124M and d=4096),
#   netns-probe (whether the shaped mesh can run there, with a carried iproute2), link-probe (bench link there;
#   after netns-probe),
#   decentralized-pca-average-loss (the pca loss runs' protocol for pca+diloco against pca+average),
#   wire-paper-ablation (-s1, -s2, -4stages: the subspace and bottleneck boundaries' differences from their
#   papers, one at a time, 124M, 1200 steps, one seed a stage)
set -uo pipefail
out=${1:?output directory}; shift
stages=${*:-tests kernels ffn gpt bits demo quant cache lora wire}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
az() { python3 -m actzip_bench "$@"; }  # the actzip command
# the 124M GPT in 2 stages for 300 steps, as the learning-rate sweeps run it
wire300=(--device cuda --model gpt2-124m --block-size 256 --stages 2 --batch-size 32 --microbatches 8
         --steps 300 --target-steps 1 --matmul-precision high --bandwidths 200)
# the same for 1200 steps, every batch fresh windows (no memorising a fixed set); later options win
long="--steps 1200 --dataset-windows 0 --corpus-bytes 16000000"
anchors768="--boundary anchor_rank=768,lr=1e-4"  # full-rank anchors at d = 768
context768="--boundary anchor_rank=768,lr=1e-4,anchor_context=2"  # the same, also embedding the token before
# wire-baselines: what a user would otherwise send (float32 and bf16 dense, 8- and 4-bit quantized dense, AQ-SGD
# delta) beside subspace and the 107x anchored Stiefel boundary with its control (dense plus the same anchors),
# each at the best rate of the earlier sweeps; the dense losses the seeds' committed 300-step runs reached
baselines="dense@1.5e-4,bf16@1.5e-4,quant:4@1.5e-4,quant:8@1.5e-4,delta:8@1.5e-4,subspace:100@1.5e-4"
anchored30="stiefel:30@1.5e-4 --stage-codec quant:bits=8"
control30="stiefel:1@1.5e-4"
dense300=(1.8710383892059326 1.8979466239611307 1.8783976634343464)
# beside NAME ARGS...: one `bench wire` (wire300 plus ARGS, split at spaces) per ARGS, all at once on the one GPU,
# so only their losses count; writes NAME-<i>.json, then one log and no plots (fewer files to bring back)
beside() {
  local name=$1 i=0 words
  shift
  for spec in "$@"; do
    read -ra words <<< "$spec"
    az bench wire "${wire300[@]}" "${words[@]}" --json "$out/$name-$i.json" > "$out/$name-$i.log" 2>&1 &
    i=$((i + 1))
  done
  wait
  tail -n 14 "$out/$name"-*.log | tee "$out/$name.log"; rm -f "$out/$name"-*.png "$out/$name"-*.log
}
# bench decentralized where the bf16 wire's transfer is many times a step's compute: width 512, 512-token windows
wide=(--device cuda --n-layer 4 --n-embd 512 --block-size 512 --batch-size 128 --microbatches 4 --schedule gpipe)
wide_methods="dense,bf16,int8,int4,delta,pca"
wide_dp_methods="pca+diloco,pca+powersgd,pca+quant,int4+quant,pca+average"  # both axes compressed
wide_loss() {  # SEED [TASKS METHODS NAME]: one seed of the wide shape to dense's loss (twice the steps at most)
  local name=${4:-wide-loss-s$1}
  az bench decentralized "${wide[@]}" --pretrain-steps 300 --steps 40 --until-target 2 --seeds "$1" \
    --tasks "${2:-domain,continual}" --methods "${3:-dense,pca+quant,int4+quant,int4,delta,pca,int8,bf16}" \
    --json "$out/$name.json" > "$out/$name.log" 2>&1
}
for stage in $stages; do
  echo "== $stage $(date -u +%H:%M:%S)"
  case $stage in
    tests) python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -15 | tee "$out/tests.txt" ;;
    # a short subset of the FFN, GPT, cache and wire benchmarks, each as a committed run measured it: the same
    # figures after a change of the code's shape (recheck-wire: the seed-1 300-step dense and stiefel:16 runs)
    recheck-memory)
      for density in mid low; do
        az bench ffn --d 4096 --rows 16384 --density $density --rounds 6 --json "$out/recheck-ffn-$density.json" | tail -12
      done
      az bench gpt --seq-lens 4096,8192 --loss-chunk 1024 \
        --strategies none,fused-arena,fused-arena-signpack,fused-arena-rebuild,fused-arena-rebuild-ln2 \
        --json "$out/recheck-gpt-chunk1024.json" ;;
    recheck-cache)
      az bench cache --models gpt-gelu,llama-swiglu --loss-chunk 1024 --strategies none,4bit,sketch-d8 --rounds 8 \
        --json "$out/recheck-cache-chunk1024.json" ;;
    recheck-wire)
      az bench wire "${wire300[@]}" --seed 1 --compressors dense@1.5e-4,stiefel:16@7e-5 \
        --json "$out/recheck-wire-seed1.json" ;;
    kernels) az bench kernels --json "$out/kernels.json" ;;
    ffn)
      for d in 4096 768; do for rows in 4096 8192 16384 32768; do for density in mid low; do
        az bench ffn --d $d --rows $rows --density $density --rounds 6 --json "$out/ffn-parts/d$d-r$rows-$density.json" | tail -12
      done; done; done
      python3 -m actzip_bench.memory_suite "$out" ffn ;;
    ffn-fp8)  # the same stack with float8 matmuls (Fp8Linear), 16k rows, both densities
      for density in mid low; do
        az bench ffn --matmul fp8 --density $density --rounds 6 --json "$out/ffn-fp8-parts/$density.json" | tail -12
      done
      python3 -m actzip_bench.memory_suite "$out" ffn-fp8 ;;
    gpt)  # every strategy at the default 4096-token loss chunks, then the fused ones at 1024-token chunks
      az bench gpt --json "$out/gpt.json"
      az bench gpt --seq-lens 4096,8192 --strategies none,fused-arena,fused-arena-rebuild-ln2,fused-arena-rebuild \
        --json "$out/gpt-chunk4096.json"
      az bench gpt --seq-lens 4096,8192 --loss-chunk 1024 \
        --strategies none,fused-arena,fused-arena-signpack,fused-arena-rebuild,fused-arena-rebuild-ln2 \
        --json "$out/gpt-chunk1024.json" ;;
    ffn16k)  # the FFN sweep's 16k-row d=4096 runs only (sign packing's cost), into the same parts
      for density in mid low; do
        az bench ffn --d 4096 --rows 16384 --density $density --rounds 6 --json "$out/ffn-parts/d4096-r16384-$density.json" | tail -12
      done ;;
    bits) az bench bits --json "$out/bits.json" ;;
    demo) az demo --no-progress --json "$out/demo-h200-small.json" ;;
    quant) az bench quant --json "$out/quant.json" ;;
    cache) az bench cache --json "$out/cache.json" ;;
    # the lossy cache at a 7B model's width (4 blocks of d=4096), with 1024-token loss chunks so that the head's
    # float32 logits weigh in the peak as little as the activations they are compared with
    cache-wide) az bench cache --gpt-preset d4096x4 --models gpt-gelu,llama-swiglu --loss-chunk 1024 \
      --strategies none,checkpoint,sparse,4bit,sketch-d8 --rounds 8 --json "$out/cache-d4096x4.json" ;;
    cache-chunk1024) az bench cache --models gpt-gelu,llama-swiglu --loss-chunk 1024 \
      --strategies none,4bit,sketch-d8 --rounds 8 --json "$out/cache-chunk1024.json" ;;
    cache-host-cost)  # the cache's host time per save, every kernel launched (a tiny GPT: its forward is host-bound)
      python3 scripts/cache_host_cost.py --device cuda --json "$out/cache-host-cost-gpu.json" ;;
    cache-norms|cache-norms-wide)  # the lossy strategies beside the same with norm outputs rebuilt (+norms)
      size=(); name=cache-chunk1024-norms
      [ "$stage" = cache-norms-wide ] && size=(--gpt-preset d4096x4) && name=cache-d4096x4-norms
      az bench cache "${size[@]}" --models gpt-gelu,llama-swiglu --loss-chunk 1024 \
        --strategies none,4bit,2bit,4bit+norms,2bit+norms,sketch-d8,sketch-d8+norms --rounds 8 --json "$out/$name.json" ;;
    cache-loss-124m)  # the 124M GELU GPT's loss under 4bit and 2bit against bf16 (none: no cache), 2000 steps of
      # 8 windows of 512 tokens, every forward under bf16 autocast, every step after the third a CUDA graph's
      # replay (eager, the host's work per save made each step too slow: lossless and 4bit of three seeds side by
      # side had not finished in five minutes); seeds 0-2 side by side (losses only)
      mkdir -p "$out/presets-124m"
      for seed in 0 1 2; do
        az bench presets --model gpt2-124m --activation gelu --presets none,4bit,2bit --graphs --steps 2000 \
          --batch-size 8 --block-size 512 --lr 3e-4 --dtype bfloat16 --seed $seed --device cuda \
          --json "$out/presets-124m/gelu-seed$seed.json" > "$out/presets-124m/gelu-seed$seed.log" 2>&1 &
      done
      wait; rm -f "$out"/presets-124m/*.png; tail -qn 8 "$out"/presets-124m/*.log ;;
    cache-compile-graphs|cache-compile-graphs-wide)  # the compiled step with the codec fused into the graphs
      # (--fuse-compiled) and the graphs replayed as CUDA graphs (no host work per save), beside plain inductor
      # with the codec's custom op, at 124M (or 4 blocks of d=4096); then a profile of the fused graphed step
      size=(); name=124m
      [ "$stage" = cache-compile-graphs-wide ] && size=(--gpt-preset d4096x4) && name=d4096x4
      for mode in inductor-cudagraphs inductor; do for fuse in --fuse-compiled ""; do
        az bench cache "${size[@]}" --models gpt-gelu,llama-swiglu --loss-chunk 1024 --strategies none,4bit,2bit \
          --rounds 8 --compile $mode $fuse --json "$out/cache-compile-$name-$mode${fuse:+-fused}.json"
      done; done
      [ "$name" = 124m ] && python3 scripts/cache_profile.py --device cuda --compile inductor-cudagraphs \
        --strategies none,4bit --json "$out/cache-profile-gpt-cudagraphs.json" ;;
    cache-graphs)  # each strategy's whole eager step captured as a CUDA graph and replayed (the caches graph_safe):
      # the step without the host's work per save, at 124M and at d=4096
      az bench cache --graphs --models gpt-gelu,llama-swiglu --loss-chunk 1024 --strategies none,4bit,2bit \
        --rounds 8 --json "$out/cache-graphs-124m.json"
      az bench cache --graphs --gpt-preset d4096x4 --models gpt-gelu,llama-swiglu --loss-chunk 1024 \
        --strategies none,4bit,2bit --rounds 8 --json "$out/cache-graphs-d4096x4.json" ;;
    cache-2bit)  # the 2bit preset next to 4bit, at both widths
      az bench cache --gpt-preset d4096x4 --models gpt-gelu,llama-swiglu --loss-chunk 1024 \
        --strategies none,4bit,2bit --rounds 8 --json "$out/cache-d4096x4-2bit.json"
      az bench cache --models gpt-gelu,llama-swiglu --loss-chunk 1024 \
        --strategies none,4bit,2bit --rounds 8 --json "$out/cache-chunk1024-2bit.json" ;;
    lora) az bench lora --config h200 --json "$out/lora.json" ;;  # 3 runs per method, ~8 minutes
    lora-variants) az bench lora --config h200 --methods lora,care,care+48p1 --json "$out/lora-cosine.json" ;;
    lora-constant) az bench lora --config h200 --steps 100 --lr-schedule constant --methods lora,fa,care \
      --json "$out/lora-seeds.json" ;;
    wire-anchors)  # stiefel with full-rank anchors and a slower Stiefel step, the 124M GPT in 2 stages
      az bench wire --device cuda --model gpt2-124m --block-size 256 --stages 2 --batch-size 32 --microbatches 8 \
        --steps 300 --target-steps 2 --compressors dense,stiefel:16,stiefel-rvq:100 \
        --boundary anchor_rank=768,lr=1e-4 --json "$out/wire-anchors-124m.json" ;;
    wire) az bench wire --device cuda --model gpt2-124m --block-size 256 --stages 4 --batch-size 32 --microbatches 8 \
            --steps 600 --json "$out/wire.json" ;;
    wire-lr|wire-lr-low|wire-lr-lowest|wire-lr-floor)  # side by side on one GPU: losses only, times overlap
      if [ "$stage" = wire-lr ]; then
        groups=(dense@6e-4,dense@2e-3,subspace:100@2e-3,subspace:100@4e-3,bottleneck:100@2e-3
                dense@1e-3,stiefel:16@3e-4,stiefel:16@6e-4,stiefel-rvq:100@6e-4,stiefel-rvq:100@2e-3
                dense@3e-4,subspace:100@1e-3,stiefel:16@1e-3,stiefel-rvq:100@1e-3,bottleneck:100@1e-3)
      elif [ "$stage" = wire-lr-lowest ]; then  # below wire-lr-low's best dense rate
        groups=(dense@1e-4,subspace:100@1e-4 dense@7e-5,stiefel:16@1e-4 stiefel-rvq:100@1e-4)
      elif [ "$stage" = wire-lr-floor ]; then  # below wire-lr-lowest's best stage-compressor rates
        groups=(subspace:100@7e-5 subspace:100@5e-5 stiefel:16@7e-5)
      else  # the rates below wire-lr's best dense one
        groups=(dense@1.5e-4,subspace:100@3e-4,stiefel-rvq:100@3e-4,bottleneck:100@3e-4
                dense@2e-4,subspace:100@6e-4,stiefel:16@1.5e-4,bottleneck:100@6e-4
                dense@4.5e-4,subspace:100@1.5e-4,stiefel:16@2e-4,stiefel-rvq:100@1.5e-4
                quant:8@3e-4,delta:8@3e-4,stiefel:16@4.5e-4,stiefel-rvq:100@4e-4)
      fi
      beside "$stage" "${groups[@]/#/--compressors }" ;;
    wire-best)  # each stage compressor at its best rate of the sweeps, dense at its best, one run at a time
      az bench wire --device cuda --model gpt2-124m --block-size 256 --stages 2 --batch-size 32 --microbatches 8 \
        --steps 300 --target-steps 2 --matmul-precision high \
        --compressors dense@1.5e-4,stiefel-rvq:100@1.5e-4,stiefel:16@1.5e-4,subspace:100@1.5e-4 \
        --json "$out/wire-best-124m.json" ;;
    wire-long|wire-long-more)  # 4x the steps at the swept best rates, fresh windows (no memorising a fixed set);
      # the second half aims at the first's dense loss
      common=(--device cuda --model gpt2-124m --block-size 256 --stages 2 --batch-size 32 --microbatches 8
              --steps 1200 --target-steps 1.5 --matmul-precision high --dataset-windows 0 --corpus-bytes 16000000)
      if [ "$stage" = wire-long ]; then
        az bench wire "${common[@]}" --compressors dense@1.5e-4,subspace:100@1e-4 --json "$out/wire-long-124m.json"
      else  # dense's loss from wire-long (its JSON in OUT or in results/h200)
        prev=$(ls "$out/wire-long-124m.json" results/h200/wire-long-124m.json 2>/dev/null | head -n 1)
        target=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['target_loss'])" "$prev")
        az bench wire "${common[@]}" --compressors stiefel:16@1e-4,stiefel-rvq:100@1.5e-4 --target-loss "$target" \
          --boundary anchor_rank=768,lr=1e-4 --json "$out/wire-long-124m-more.json"  # full-rank anchors
      fi ;;
    wire-long-stage-lr)  # 1200 fresh-window steps with the best stage factors of the 300-step sweeps, side by side
      beside wire-long-stage-lr "$long --compressors dense@3e-4 --stage-lr-scale 1,0.5" \
        "$long --compressors stiefel:16@6e-4 --stage-lr-scale 1,0.075" ;;
    wire-long-stage-lr-more)  # the second-best factors, and the best with a shared projection and full anchors
      beside wire-long-stage-lr-more "$long --compressors stiefel:16@3e-4 --stage-lr-scale 1,0.15" \
        "$long --compressors stiefel:16@6e-4 --stage-lr-scale 1,0.075 --boundary tie=true,anchor_rank=768" ;;
    wire-seeds)  # the swept best rates again from seeds 1 and 2 (weights, batches, codec noise): wire-seeds-0, -1
      beside wire-seeds "--seed 1 --compressors dense@1.5e-4,subspace:100@1e-4,stiefel:16@7e-5" \
        "--seed 2 --compressors dense@1.5e-4,subspace:100@1e-4,stiefel:16@7e-5" ;;
    wire-ratios)  # stiefel at 4x and 8x at stiefel:16's best rate, beside the sweep: wire-ratios-0, -1
      beside wire-ratios "--compressors stiefel:4@7e-5" "--compressors stiefel:8@7e-5" ;;
    wire-vstep)  # what the stiefel boundary costs at dense's best rate: frozen or slower projections, no compression
      beside wire-vstep "--compressors stiefel:16@1.5e-4 --boundary lr=1e-12" \
        "--compressors stiefel:16@1.5e-4 --boundary lr=1e-4" "--compressors stiefel:1@1.5e-4 --boundary lr=1e-3" \
        "--compressors stiefel:4@1.5e-4 --boundary lr=1e-3" ;;
    wire-tie)  # one projection shared by both ends of the stiefel boundary, k = d to 16x, dense beside
      beside wire-tie "--compressors dense@1.5e-4" "--compressors stiefel:1@1.5e-4 --boundary tie=true" \
        "--compressors stiefel:4@1.5e-4 --boundary tie=true" \
        "--compressors stiefel:16@1.5e-4 --boundary tie=true,lr=1e-4" \
        "--compressors stiefel:16@7e-5 --boundary tie=true" \
        "--compressors stiefel-rvq:100@1.5e-4 --boundary tie=true" ;;
    wire-stage-lr)  # the stage after the boundary at a fraction of the rate
      beside wire-stage-lr "--compressors dense@3e-4 --stage-lr-scale 1,0.3" \
        "--compressors stiefel:16@1.5e-4 --stage-lr-scale 1,0.15" \
        "--compressors stiefel:16@3e-4 --stage-lr-scale 1,0.15" \
        "--compressors stiefel:16@1.5e-4 --stage-lr-scale 1,0.3" \
        "--compressors stiefel-rvq:100@1.5e-4 --stage-lr-scale 1,0.15" \
        "--compressors subspace:100@1.5e-4 --stage-lr-scale 0.3,1" ;;
    wire-stage-lr-more)  # dense and the compressors over more base rates and factors; k = d and 4x tied
      beside wire-stage-lr-more "--compressors dense@3e-4 --stage-lr-scale 1,0.15" \
        "--compressors dense@6e-4 --stage-lr-scale 1,0.15" "--compressors dense@6e-4 --stage-lr-scale 1,0.3" \
        "--compressors dense@3e-4 --stage-lr-scale 1,0.5" "--compressors stiefel:16@6e-4 --stage-lr-scale 1,0.15" \
        "--compressors stiefel:16@3e-4 --stage-lr-scale 1,0.1" \
        "--compressors stiefel:16@6e-4 --stage-lr-scale 1,0.075" \
        "--compressors subspace:100@3e-4 --stage-lr-scale 1,0.15" \
        "--compressors stiefel:1@1.5e-4 --boundary tie=true" "--compressors stiefel:4@1.5e-4 --boundary tie=true" ;;
    wire-code-bits)  # 8-bit codes of about 4x the width for the same bytes (stiefel:30, subspace:30: over 100x
      # with the 8-bit group scales and the ids at d = 768; stiefel:4: about 16x), full-rank anchors, side by side
      beside wire-code-bits "--compressors stiefel:30@1e-4 --stage-codec quant:bits=8 $anchors768" \
        "--compressors stiefel:30@1.5e-4 --stage-codec quant:bits=8 $anchors768" \
        "--compressors stiefel:4@1e-4 --stage-codec quant:bits=8 $anchors768" \
        "--compressors subspace:30@1e-4 --stage-codec quant:bits=8" \
        "--compressors stiefel:30@6e-4 --stage-codec quant:bits=8 $anchors768 --stage-lr-scale 1,0.075" \
        "--compressors stiefel:4@6e-4 --stage-codec quant:bits=8 --stage-lr-scale 1,0.075" ;;
    wire-long-code-bits)  # the 8-bit-code entries over 1200 fresh-window steps, side by side (dense: wire-long)
      beside wire-long-code-bits \
        "$long --compressors stiefel:30@1e-4 --stage-codec quant:bits=8 $anchors768" \
        "$long --compressors stiefel:30@1.5e-4 --stage-codec quant:bits=8 $anchors768" \
        "$long --compressors stiefel:4@1e-4 --stage-codec quant:bits=8 $anchors768" ;;
    wire-long-code-bits-lr)  # stiefel:30 with 8-bit codes at higher rates, and dense at the higher rate too
      beside wire-long-code-bits-lr \
        "$long --compressors stiefel:30@2.5e-4 --stage-codec quant:bits=8 $anchors768" \
        "$long --compressors stiefel:30@4e-4 --stage-codec quant:bits=8 $anchors768" \
        "$long --compressors dense@2.5e-4" ;;
    wire-longer-code-bits)  # 1800 fresh-window steps: does the gap keep closing? (dense beside it, same rate)
      beside wire-longer-code-bits \
        "$long --steps 1800 --compressors stiefel:30@1.5e-4 --stage-codec quant:bits=8 $anchors768" \
        "$long --steps 1800 --compressors dense@1.5e-4" ;;
    wire-longest-code-bits)  # the same pair over 2400 fresh-window steps (about 8 minutes)
      beside wire-longest-code-bits \
        "$long --steps 2400 --compressors stiefel:30@1.5e-4 --stage-codec quant:bits=8 $anchors768" \
        "$long --steps 2400 --compressors dense@1.5e-4" ;;
    wire-long-context)  # the 1200-step 8-bit-code entries with anchors that also embed the token before, and
      # their control: a tied full-width boundary adding the whole anchors (dense plus the same anchors)
      beside wire-long-context \
        "$long --compressors stiefel:30@1.5e-4 --stage-codec quant:bits=8 $context768" \
        "$long --compressors stiefel:4@1e-4 --stage-codec quant:bits=8 $context768" \
        "$long --compressors stiefel:1@1.5e-4 $context768,width=768,tie=true,anchor_whole=true" ;;
    wire-long-context-seed1)  # the 107x entry, its control and plain dense again under seed 1
      beside wire-long-context-seed1 \
        "$long --seed 1 --compressors dense@1.5e-4" \
        "$long --seed 1 --compressors stiefel:30@1.5e-4 --stage-codec quant:bits=8 $context768" \
        "$long --seed 1 --compressors stiefel:1@1.5e-4 $context768,width=768,tie=true,anchor_whole=true" ;;
    wire-long-context-16x)  # about 16x with two-token anchors: float32 codes at two rates, 8-bit codes at 19x
      beside wire-long-context-16x \
        "$long --compressors stiefel:16@1.5e-4 $context768" \
        "$long --compressors stiefel:16@2.5e-4 $context768" \
        "$long --compressors stiefel:5@1.5e-4 --stage-codec quant:bits=8 $context768" ;;
    wire-long-context-16x-seed1)  # the two about-16x entries that scored best, under seed 1
      beside wire-long-context-16x-seed1 \
        "$long --seed 1 --compressors stiefel:16@1.5e-4 $context768" \
        "$long --seed 1 --compressors stiefel:5@1.5e-4 --stage-codec quant:bits=8 $context768" ;;
    wire-longest-context)  # 2400 steps of the 107x entry with two-token anchors and of its control (dense at 2400
      # steps is in wire-longest-code-bits), side by side (about 8 minutes)
      beside wire-longest-context \
        "$long --steps 2400 --compressors stiefel:30@1.5e-4 --stage-codec quant:bits=8 $context768" \
        "$long --steps 2400 --compressors stiefel:1@1.5e-4 $context768,width=768,tie=true,anchor_whole=true" ;;
    wire-4800-dense|wire-4800-stiefel)  # 4800 fresh-window steps, one run alone per call (about 8 minutes each)
      entry="dense@1.5e-4"
      [ "$stage" = wire-4800-stiefel ] && entry="stiefel:30@1.5e-4 --stage-codec quant:bits=8 $anchors768"
      beside "$stage" "$long --steps 4800 --compressors $entry" ;;
    wire-baselines-time)  # each baselines entry alone for 30 steps: its compute, undisturbed, for the step times
      mkdir -p "$out/wire-baselines"
      t=0
      for spec in "--compressors $baselines" "--compressors $anchored30 $context768" \
                  "--compressors $control30 $context768,width=768,tie=true,anchor_whole=true"; do
        read -ra words <<< "$spec"
        az bench wire "${wire300[@]}" --steps 30 "${words[@]}" --json "$out/wire-baselines/time-$((++t)).json" \
          > "$out/wire-baselines/time-$t.log" 2>&1
      done ;;
    wire-baselines)  # the baselines a user would pick beside the compressed boundaries, seeds 0-2, one process per
      # (seed, entry), 12 at a time; each trains on (to twice the steps) to the dense loss its seed's committed
      # 300-step run reached, so losses count, step times come from wire-baselines-time
      mkdir -p "$out/wire-baselines"
      jobs=()
      for seed in 0 1 2; do
        target=${dense300[$seed]}
        for entry in ${baselines//,/ }; do
          jobs+=("--seed $seed --target-loss $target --compressors $entry|seed$seed-${entry%%@*}")
        done
        jobs+=("--seed $seed --target-loss $target --compressors $anchored30 $context768|seed$seed-anchored30")
        jobs+=("--seed $seed --target-loss $target --compressors $control30 $context768,width=768,tie=true,anchor_whole=true|seed$seed-control")
      done
      printf '%s\n' "${jobs[@]}" | xargs -P 12 -I{} bash -c 'spec="${1%|*}"; name="${1##*|}"; name=${name//:/-}
        python3 -m actzip_bench bench wire '"${wire300[*]}"' --target-steps 2 $spec \
          --json "'"$out"'/wire-baselines/$name.json" > "'"$out"'/wire-baselines/$name.log" 2>&1 || echo "FAILED $name"' _ {} ;;
    decentralized-wide-speed)  # the wide shape's step times, one seed alone on the machine (the loss runs' times;
      # the committed H100 record ran the first eight methods, before pca+quant, int4+quant and pca+average)
      az bench decentralized "${wide[@]}" --pretrain-steps 20 --steps 20 --seeds 0 --tasks domain \
        --methods "$wide_methods,$wide_dp_methods" --json "$out/decentralized-wide-speed.json" ;;
    decentralized-wide-loss)  # seeds 0-2 side by side on the one GPU, each training on (to twice the steps) to
      # dense's loss: losses and the steps to the target count, their step times come from the speed record; both
      # tasks in one run per seed (one pretraining), the methods most in question first
      for seed in 0 1 2; do wide_loss $seed & done
      wait
      rm -f "$out"/wide-loss-*.png; tail -n 3 "$out"/wide-loss-*.log ;;
    decentralized-wide-loss-alone)  # the same runs one seed after the other, each alone on the machine (an H100
      # cannot hold three side by side): each record's step times are its own
      for seed in 0 1 2; do wide_loss $seed; done
      rm -f "$out"/wide-loss-*.png; tail -n 3 "$out"/wide-loss-*.log ;;
    decentralized-wide-loss-s2-continual)  # the runs seed 2's record lacks (its continual pca, int8, bf16), with
      # dense first for their target
      wide_loss 2 continual dense,pca,int8,bf16 wide-loss-s2-continual; tail -n 3 "$out/wide-loss-s2-continual.log"
      rm -f "$out"/wide-loss-*.png ;;
    netns-probe)  # whether this machine can hold the shaped mesh (NetnsMesh: namespaces, veth, tc tbf): it has no
      # iproute2 of its own; carry Debian's as .debs in .iproute2/ (apt-get download iproute2 libbpf1 libmnl0
      # libelf1 libcap2-bin libxtables12), unpacked outside / and put on PATH for the run
      mkdir -p /tmp/ipr && for f in .iproute2/*.deb; do dpkg -x "$f" /tmp/ipr; done
      export PATH=/tmp/ipr/bin:/tmp/ipr/usr/sbin:/tmp/ipr/sbin:/tmp/ipr/usr/bin:$PATH
      export LD_LIBRARY_PATH=/tmp/ipr/usr/lib/x86_64-linux-gnu:/tmp/ipr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      python3 -c "from actzip.wire import netns_unavailable_reason as r; print('netns:', r() or 'available')" \
        | tee "$out/netns-probe.txt"
      # the tools alone do not say whether this container may make namespaces: try one
      (ip netns add azprobe && ip netns del azprobe && echo "netns add: ok" || echo "netns add: failed") 2>&1 \
        | tee -a "$out/netns-probe.txt" ;;
    link-probe)  # after netns-probe (its PATH): messages and two ranks' all-gathers over a shaped 200 Mbit/s link,
      # timed against the link model (the model's collective time on this machine's kernel)
      grep -q "netns add: ok" "$out/netns-probe.txt" 2>/dev/null || { echo "skipped: no namespaces here"; continue; }
      az bench link --sizes 16000,250000,1000000,2000000,4000000,8000000 --json "$out/link-gpu.json" > "$out/link-gpu.log" 2>&1; tail -n 20 "$out/link-gpu.log" ;;
    decentralized-shaped-gpu)  # after netns-probe (its PATH): the 4-bit data-parallel sync on a shaped 200 Mbit/s
      # link, every rank in a namespace, the GPU computing (width 512, 256-token windows), one seed, domain
      grep -q "netns add: ok" "$out/netns-probe.txt" 2>/dev/null || { echo "skipped: no namespaces here"; continue; }
      az bench decentralized --device cuda --n-layer 4 --n-embd 512 --block-size 256 --batch-size 32 \
        --microbatches 4 --schedule gpipe --pretrain-steps 300 --steps 40 --until-target 2 --seeds 0 --tasks domain \
        --methods dense,int4+quant,pca+quant --shaped-link 200,50 --json "$out/shaped-gpu.json" \
        > "$out/shaped-gpu.log" 2>&1; tail -n 12 "$out/shaped-gpu.log"; rm -f "$out/shaped-gpu.png" ;;
    decentralized-wide-shaped-s0|decentralized-wide-shaped-s1|decentralized-wide-shaped-s2)  # after netns-probe:
      # the wide shape's 4-bit-sync methods on the shaped 200 Mbit/s link, one seed a stage (about 7 minutes),
      # dense off the link (float32 over it would take most of an hour) as the target; int4+quant is the
      # trivial wire the model found fastest to dense's loss there (decentralized-wide-loss.json)
      grep -q "netns add: ok" "$out/netns-probe.txt" 2>/dev/null || { echo "skipped: no namespaces here"; continue; }
      seed=${stage##*-s}
      az bench decentralized "${wide[@]}" --pretrain-steps 300 --steps 40 --until-target 2 --seeds "$seed" \
        --methods dense,int4+quant,pca+quant --shaped-link 200,50 --dense-off-link --keep-replay \
        --json "$out/wide-shaped-s$seed.json" > "$out/wide-shaped-s$seed.log" 2>&1
      tail -n 3 "$out/wide-shaped-s$seed.log"; rm -f "$out/wide-shaped-s$seed.png" ;;
    decentralized-unshaped-gpu)  # decentralized-shaped-gpu's runs with every rank on this host (no namespaces): the
      # data-parallel sync's own work without a slow link under it
      az bench decentralized --device cuda --n-layer 4 --n-embd 512 --block-size 256 --batch-size 32 \
        --microbatches 4 --schedule gpipe --pretrain-steps 300 --steps 40 --until-target 2 --seeds 0 --tasks domain \
        --methods dense,int4+quant,pca+quant --json "$out/unshaped-gpu.json" > "$out/unshaped-gpu.log" 2>&1
      tail -n 8 "$out/unshaped-gpu.log"; rm -f "$out/unshaped-gpu.png" ;;
    decentralized-pca-average-loss)  # the pca loss runs' protocol (width 512, 256-token windows, 3 seeds side by
      # side) for the data-parallel compressions: DiLoCo's outer step against a plain average every 10 steps
      for seed in 0 1 2; do
        az bench decentralized --device cuda --n-layer 4 --n-embd 512 --block-size 256 --batch-size 32 \
          --microbatches 4 --schedule gpipe --pretrain-steps 300 --steps 150 --seeds $seed \
          --methods dense,bf16,pca,pca+diloco,pca+average --json "$out/pca-average-s$seed.json" \
          > "$out/pca-average-s$seed.log" 2>&1 &
      done
      wait
      rm -f "$out"/pca-average-s*.png; tail -n 3 "$out"/pca-average-s*.log ;;
    wire-paper-ablation|wire-paper-ablation-s1|wire-paper-ablation-s2|wire-paper-ablation-4stages)
      # the subspace and bottleneck boundaries with each difference from their papers changed alone and all
      # together, dense beside under both optimizers (scripts/wire_ablation.sh paper): the 124M GPT, 1200
      # fresh-window steps at dense's best 1200-step rate, every variant of a seed at once on the one GPU (losses
      # only); seed 0, or -s1 / -s2, or 4 stages (seed 0)
      seed=0; n=2; case $stage in *-s1) seed=1 ;; *-s2) seed=2 ;; *-4stages) n=4 ;; esac
      SEEDS=$seed bash scripts/wire_ablation.sh paper "$out/wire-paper-ablation-${n}st" 12 --model gpt2-124m \
        --block-size 256 --batch-size 32 --microbatches 8 --steps 1200 --lr 1e-4 --corpus-bytes 16000000 \
        --device cuda --matmul-precision high --bandwidths 200 --stages $n
      tail -qn 4 "$out/wire-paper-ablation-${n}st"/*.log | grep -v '^$' | tail -n 40 ;;
    wire-nccl)  # 2 GPUs, one process each (not in the default list); NVLink multicast stays off
      NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        az bench wire --mode processes --device cuda --model gpt2-124m --block-size 256 --stages 2 --batch-size 32 \
        --microbatches 8 --steps 300 --target-steps 2 \
        --compressors dense,quant:8,subspace:100,stiefel:16,stiefel-rvq:100,bottleneck:100,delta:8 \
        --json "$out/wire-nccl.json" ;;
  esac
done
