# device call 3: wait for call 2's background runs (at most ~8 minutes), bring everything back in one archive,
# then with the GPU free and time left: the 4bit step's profile at 124M and the cache strategies beside +norms
set -x
t0=$(date +%s); repo=$(pwd)
for i in $(seq 1 32); do
  pgrep -f "actzip_bench bench" > /dev/null || break
  sleep 15
done
pgrep -af "actzip_bench bench" | head
ls -la /root/res /root/res/*/
tail -n 6 /root/res/presets-124m/*.log /root/res/wire-paper-ablation-2st/*.log 2>/dev/null | tail -80
cd /root/res && rm -f */*.png && tar -czf $OUT/res.tar.gz . ; cd "$repo"
export PYTHONPATH=src PYTHONUNBUFFERED=1 ACTZIP_CODE_VERSION=387da67
if ! pgrep -f "actzip_bench bench" > /dev/null; then
  timeout 100 python3 scripts/cache_profile.py --device cuda --model gpt-gelu --strategies none,4bit,4bit+norms --json $OUT/cache-profile-gpt.json
  timeout 100 python3 scripts/cache_profile.py --device cuda --model llama-swiglu --strategies none,4bit,4bit+norms --json $OUT/cache-profile-llama.json
  left=$(( 575 - ($(date +%s) - t0) ))
  [ $left -gt 150 ] && timeout $left bash scripts/h200_bench.sh $OUT cache-norms 2>&1 | tail -40
fi
ls -la $OUT
