#!/bin/bash
# L2 prefetch of upcoming weights (issue #6, docs/CUDA.md "Session 5") in one call on the GPU
# machine, variants side by side (V below: off, each site alone, budgets, SCR_CUDA_L2_PREFETCH_WAIT):
#   tests/cuda/prefetch_ab.sh CARRY_DIR          (NCU_TOO=1 adds Nsight Compute CSVs, on vs off)
# The carry holds `scr` built with -DSCR_MODELS="llama-3.2-1b;llama-3.1-8b;tiny-llama;tiny-qwen3"
# -DSCR_QUANT=bf16 (tests/cuda/pack_carry.sh). Most important first, each step under its own timeout:
# random Llama-3.2-1B, 48 greedy tokens off vs each prefetch variant (must be identical: only
# memory traffic changes), `scr bench --mode forward` at batch 1 for each variant (off and the
# best guess repeated at the end to see the run's noise), B = 16 / 64 off vs on twice each, the bf16
# fixtures with both sites on, then Llama-3.1-8B (batch 1 off / on twice, greedy off == on), then
# (NCU_TOO) per-kernel CSVs of 1B decode steps (--cache-control none: a kernel meets the L2 as the
# one before it left it). Logs to $OUT.
set -u
CARRY=${1:-.l2-carry}
OUT=${OUT:-/tmp/scr-l2-out}
LOGS=/tmp/scr-l2-logs
mkdir -p "$OUT" "$LOGS"
C=/tmp/scr-l2-bin
mkdir -p $C && tar -C $C -xJf "$CARRY/bin.tar.xz" || { echo "cannot unpack $CARRY/bin.tar.xz"; exit 1; }
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 SCR_REQUIRE_GPU=1 SCR_HUGE_PAGES=0
command -v ncu >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
summary=()
step() {  # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
    echo "== $name: rc=$rc ($((SECONDS - t0)) s) $(grep -h '^decode batch' "$LOGS/$name.txt" | head -1)"
    { echo "==== $name: $* -> rc=$rc"; cat "$LOGS/$name.txt"; } >> "$OUT/prefetch_ab.log"
}
same() {  # same A B: greedy outputs identical?
    if [ -s "$LOGS/$1.txt" ] && cmp -s "$LOGS/$1.txt" "$LOGS/$2.txt"; then echo "greedy tokens: $1 == $2"; else echo "greedy tokens: $1 != $2"; fi |
        tee -a "$OUT/prefetch_ab.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
declare -A V=(  # every budget spelled out (the code's defaults: off; when on 12 MB attention, 0 next, wait)
    [off]="SCR_CUDA_L2_PREFETCH=0"
    [both]="SCR_CUDA_L2_PREFETCH=1 SCR_CUDA_L2_PREFETCH_MB=24 SCR_CUDA_L2_PREFETCH_NEXT_MB=16 SCR_CUDA_L2_PREFETCH_WAIT=0"
    [attn]="SCR_CUDA_L2_PREFETCH=1 SCR_CUDA_L2_PREFETCH_MB=24 SCR_CUDA_L2_PREFETCH_NEXT_MB=0 SCR_CUDA_L2_PREFETCH_WAIT=0"
    [attn_wait]="SCR_CUDA_L2_PREFETCH=1 SCR_CUDA_L2_PREFETCH_MB=24 SCR_CUDA_L2_PREFETCH_NEXT_MB=0 SCR_CUDA_L2_PREFETCH_WAIT=1"
    [attn_wait12]="SCR_CUDA_L2_PREFETCH=1 SCR_CUDA_L2_PREFETCH_MB=12 SCR_CUDA_L2_PREFETCH_NEXT_MB=0 SCR_CUDA_L2_PREFETCH_WAIT=1"
    [attn_wait40]="SCR_CUDA_L2_PREFETCH=1 SCR_CUDA_L2_PREFETCH_MB=40 SCR_CUDA_L2_PREFETCH_NEXT_MB=0 SCR_CUDA_L2_PREFETCH_WAIT=1"
    [both_wait]="SCR_CUDA_L2_PREFETCH=1 SCR_CUDA_L2_PREFETCH_MB=24 SCR_CUDA_L2_PREFETCH_NEXT_MB=16 SCR_CUDA_L2_PREFETCH_WAIT=1"
    [next_only]="SCR_CUDA_L2_PREFETCH=1 SCR_CUDA_L2_PREFETCH_MB=0 SCR_CUDA_L2_PREFETCH_NEXT_MB=16 SCR_CUDA_L2_PREFETCH_WAIT=0"
)
step make_1b 40 $C/scr make-random models/configs/llama/llama-3.2-1b.json /dev/shm/l1b --dtype bf16
G="complete /dev/shm/l1b --ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 48 --temperature 0 --json"
step greedy_off 25 env ${V[off]} $C/scr $G
for v in both attn_wait both_wait; do step greedy_$v 25 env ${V[$v]} $C/scr $G; same greedy_off greedy_$v; done
F="bench /dev/shm/l1b --mode forward --input-len 16 --context 192 --iters 50"
for v in ${VARIANTS_1B:-off attn attn_wait attn_wait12 attn_wait40 both both_wait next_only off attn_wait}; do
    n=fwd1_$v; [ -f "$LOGS/$n.txt" ] && n=${n}_again
    step $n 25 env ${V[$v]} $C/scr $F --batch 1
done
for b in 16 64; do for v in off attn_wait off attn_wait; do
    n=fwd${b}_$v; [ -f "$LOGS/$n.txt" ] && n=${n}_again
    step $n 25 env ${V[$v]} $C/scr $F --batch $b
done; done
step fixtures_bf16 60 env ${V[both_wait]} python3 tests/cuda/fixture_check.py $C/scr --quant bf16 --rtol 3e-2 tests/fixtures/LlamaForCausalLM tests/fixtures/Qwen3ForCausalLM
if step make_8b 70 $C/scr make-random models/configs/llama/llama-3.1-8b.json /dev/shm/l8b --dtype bf16; then
    F8="bench /dev/shm/l8b --mode forward --input-len 16 --context 192 --iters 20"
    for v in off attn_wait attn off attn_wait; do
        n=fwd8b_$v; [ -f "$LOGS/$n.txt" ] && n=${n}_again
        step $n 30 env ${V[$v]} $C/scr $F8 --batch 1
    done
    G8="complete /dev/shm/l8b --ids 1,2,3,4,5,6,7,8 --max-tokens 24 --temperature 0 --json"
    step greedy8b_off 30 env ${V[off]} $C/scr $G8
    step greedy8b_both_wait 30 env ${V[both_wait]} $C/scr $G8
    same greedy8b_off greedy8b_both_wait
    rm -rf /dev/shm/l8b
fi
if [ -n "${NCU_TOO:-}" ]; then
    NCU="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --launch-skip 200 --launch-count 110"
    for v in both off; do
        step ncu_$v 45 env ${V[$v]} $NCU $C/scr complete /dev/shm/l1b --ids 1,2,3,4,5,6,7,8 --max-tokens 6 --temperature 0
        cp "$LOGS/ncu_$v.txt" "$OUT/ncu_$v.csv" 2>/dev/null
    done
fi
echo; echo "==== summary"; printf '%s\n' "${summary[@]}"
echo "==== decode lines"
for f in "$LOGS"/fwd*.txt; do echo "$(basename "$f" .txt): $(grep -h '^decode batch' "$f")"; done
grep -h "fixtures match\|rel_err\|differs\|FAILED\|PASSED" "$LOGS"/fixtures*.txt | head -12
