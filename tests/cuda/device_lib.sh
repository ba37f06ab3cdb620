# Sourced by the device scripts (tests/cuda/*.sh run through the run tool on the GPU machine):
#   device_begin OUT_DEFAULT [LOGS]   the scripts' common start: OUT (the caller's, else OUT_DEFAULT)
#                                     and LOGS (default $OUT/logs) made, everything after it also
#                                     written to $OUT/summary.txt, the GPU and its clocks named;
#   device_unpack CARRY_DIR BIN_DIR   unpacks CARRY_DIR/bin.tar.xz (tests/cuda/pack_carry.sh) into
#                                     BIN_DIR (sets C), puts its lib/ and the toolkit's libraries on
#                                     LD_LIBRARY_PATH and the toolkit's tools (ncu, compute-sanitizer)
#                                     on PATH, reads weights from the file mapping (SCR_HUGE_PAGES=0),
#                                     and names the carry's build (its BUILD or COMMIT file);
#   step NAME TIMEOUT CMD...          runs CMD under timeout, its output in $LOGS/NAME.txt, and adds
#                                     "NAME: rc=... (... s)" to the summary array;
#   model_config KEY                  the config.json of model KEY (below; an unknown key: rc 1, named);
#   make_model KEY                    a random bf16 checkpoint of model KEY (1b = Llama-3.2-1B, 8b =
#                                     Llama-3.1-8B, 30b = Qwen3-30B-A3B) in /dev/shm/mKEY (sets M),
#                                     made by $C/scr as step make_random_KEY, once per machine (a
#                                     later call finds it by its .made mark);
#   ncu_digest REP KEY                from the Nsight Compute report REP.ncu-rep: the text report in
#                                     $OUT/ncu_KEY.txt, the stall samples per SASS instruction (ncu's
#                                     source page as CSV) in $OUT/sass_KEY.csv, and on stdout a digest
#                                     of the headline metrics and the instructions with the most samples;
#   ncu_profile KEY KERNEL SKIP LIMIT CMD...
#                                     Nsight Compute's full set (clocks as found) on the launch after
#                                     SKIP launches of kernels matching KERNEL while CMD runs (its output
#                                     in $OUT/ncu_run_KEY.txt; at most LIMIT s), "==== KEY rc=..." on
#                                     stdout, then ncu_digest of the report;
#   decode_line KEY                   the decode rows of `scr cuda-bench`'s log $LOGS/KEY.txt on one
#                                     line: "KEY | batch: tok/s (run ahead) ...";
#   make_model_any KEY                make_model, or (a quantized-only scr cannot make a bf16
#                                     checkpoint) the same random bf16 checkpoint made by transformers
#                                     with our config.json, as step make_py_KEY (1b / 8b only);
#   bench_round KEY MODEL R BATCHES VARIANT...
#                                     one round (R) of an interleaved A/B: per VARIANT, `scr cuda-bench
#                                     MODEL --prompt $PROMPT (128) --decode 64 --prefill 0 --batches
#                                     BATCHES` as step b_KEY_VARIANT_rR, then its decode_line. A variant
#                                     is `default`, `base` (the scr in $SB, which qrows_ab.sh and
#                                     regime_ab.sh set from BASE=CARRY_DIR: another build's defaults) or
#                                     NAME=VALUE[+NAME=VALUE...] (all set; no + or spaces in values);
#                                     the scr is $S/scr.
summary=()
device_begin() {
    OUT=${OUT:-$1}
    LOGS=${2:-$OUT/logs}
    mkdir -p "$OUT" "$LOGS"
    exec > >(tee -a "$OUT/summary.txt") 2>&1
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
}
decode_line() {
    echo "$1 | $(grep -E '^decode batch +[0-9]+:' "$LOGS/$1.txt" | sed -E 's/^decode batch +([0-9]+): ([0-9]+) tok\/s sampling on the GPU \(([0-9]+) run ahead\).*/\1: \2 (\3)/' | tr '\n' ' ')"
}
device_unpack() {
    C=$2
    rm -f "$C/BUILD" "$C/COMMIT"  # an earlier unpack's, on a warm machine
    mkdir -p "$C" && tar -C "$C" -xJf "$1/bin.tar.xz" || { echo "cannot unpack $1/bin.tar.xz"; exit 1; }
    # pack_carry.sh writes BUILD, pack_llamacpp.sh COMMIT: the binaries' source, not this tree's git
    local f built="build not recorded"
    for f in "$C/BUILD" "$C/COMMIT"; do [ -f "$f" ] && built=$(cat "$f"); done
    echo "carry $1: $built"
    export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PYTHONUNBUFFERED=1 SCR_HUGE_PAGES=0
    command -v ncu >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
}
step() {
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    summary+=("$name: rc=$rc ($((SECONDS - t0)) s)")
}
# The config.json of model KEY (1b, 8b, 30b); an unknown key is named on stderr (rc 1).
model_config() {
    case $1 in
    1b) echo models/configs/llama/llama-3.2-1b.json ;;
    8b) echo models/configs/llama/llama-3.1-8b.json ;;
    30b) echo models/configs/qwen3_moe/qwen3-30b-a3b.json ;;
    *) echo "unknown model key '$1' (known: 1b, 8b, 30b)" >&2; return 1 ;;
    esac
}
make_model() {
    local cfg
    cfg=$(model_config "$1") || exit 2
    M=/dev/shm/m$1
    # made already in this machine's session (a later part of the same call): kept, not made again
    [ -f $M/.made ] && return
    step "make_random_$1" 120 $C/scr make-random "$cfg" $M --dtype bf16
    if [[ ${summary[-1]} == *": rc=0 ("* ]]; then touch $M/.made; fi
}
make_model_any() {
    make_model $1
    [ -f $M/config.json ] && return
    case $1 in 1b | 8b) ;; *) echo "make_model_any: the transformers fallback makes Llama models only, not '$1'" >&2; return 1 ;; esac
    local cfg
    cfg=$(model_config "$1")
    step make_py_$1 300 python3 -c "
import sys, torch, transformers
c = transformers.LlamaConfig.from_json_file('$cfg')
torch.manual_seed(1)
with torch.device('cuda'):
    m = transformers.LlamaForCausalLM(c).to(torch.bfloat16)
m.save_pretrained('$M', safe_serialization=True)
"
    cp $cfg $M/config.json  # transformers 5 rewrites rope_scaling as rope_parameters; the tensors are the same
}
ncu_profile() {
    local key=$1 kernel=$2 skip=$3 limit=$4
    shift 4
    timeout "$limit" ncu --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 --clock-control none \
        --set full --import-source no -o "/tmp/scr-ncu-$key" -f "$@" > "$OUT/ncu_run_$key.txt" 2>&1
    echo "==== $key rc=$?"
    ncu_digest "/tmp/scr-ncu-$key" "$key"
}
ncu_digest() {
    local rep=$1 key=$2
    ncu -i "$rep.ncu-rep" --print-details all > "$OUT/ncu_$key.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_$key.csv" 2>&1
    grep -E "Duration|Elapsed Cycles|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Block Size|Grid Size|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Executed Ipc A|Stall [A-Z]|Mem Busy|Max Bandwidth|Executed Instructions  " "$OUT/ncu_$key.txt" | head -60
    python3 - "$OUT/sass_$key.csv" <<'PY' || true
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(r for r in rows if "Address" in r and "Source" in r)
data = rows[rows.index(hdr) + 1:]
col = {k: hdr.index(k) for k in ("Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb")}
num = lambda v: int(v or 0)
total = sum(num(r[col["Warp Stall Sampling (All Samples)"]]) for r in data)
print(f"stall samples: {total}; SASS instructions: {len(data)}; the 12 with the most (share, long-scoreboard samples):")
for r in sorted(data, key=lambda r: -num(r[col["Warp Stall Sampling (All Samples)"]]))[:12]:
    n = num(r[col["Warp Stall Sampling (All Samples)"]])
    print(f"  {100.0 * n / max(total, 1):5.1f} %  lsb {num(r[col['stall_long_sb']]):5d}  {r[col['Source']].strip()[:80]}")
PY
}
bench_round() {
    local key=$1 model=$2 r=$3 batches=$4 v k e x
    shift 4
    for v in "$@"; do
        k=${key}_$(printf %s "${v//SCR_CUDA_/}" | tr -c 'A-Za-z0-9' _)_r$r  # every name (less SCR_CUDA_) and value
        e=
        x=$S/scr
        [ "$v" = default ] || [ "$v" = base ] || e=${v//+/ }
        if [ "$v" = base ]; then
            [ -n "${SB:-}" ] || { echo "variant base needs BASE=CARRY_DIR"; continue; }
            x=$SB/scr
        fi
        step b_$k 200 env $e $x cuda-bench "$model" --prompt ${PROMPT:-128} --decode 64 --prefill 0 --batches "$batches"
        decode_line b_$k
    done
}
