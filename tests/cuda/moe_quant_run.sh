#!/bin/bash
# The quantized MoE experts (kernels/cuda/moe_quant.cuh) on the GPU machine, one call of the run tool
# per part, most important first:
#   OUT=$OUT [PARTS="checks 30b"] [VARIANTS="mlx-int4-g64 bf16"] [BATCHES=16,64] [BASE=CARRY_DIR2 [ROUNDS=2]] bash tests/cuda/moe_quant_run.sh CARRY_DIR
# CARRY_DIR (git-ignored; docs/CUDA.md "Session 38" / "Session 40" make it):
#   bin.tar.xz      tests/cuda/pack_carry.sh of a CUDA build with -DSCR_MODELS=tiny-qwen3-moe
#                   -DSCR_QUANT="bf16;int8;fp8;fp8-tensor;mlx-int4-g32" -DSCR_TESTS=ON;
#   expected.json   (optional) tests/cuda/quant_e2e.py expect on the CPU build: end to end checked;
#   m30/bin.tar.xz  (for part 30b) pack_carry.sh of -DSCR_MODELS=qwen3-30b-a3b -DSCR_QUANT="bf16;mlx-int4-g64"
#                   (and any other preset VARIANTS names, e.g. int8).
# Parts:
#   checks  scr_cuda_moe (every format against float64, grouped vs per pair and each row alone bit for
#           bit, then the experts' times per call at Qwen3-30B-A3B's shape); with BASE (another
#           carry's bin.tar.xz), ROUNDS alternating runs of its scr_cuda_moe and ours, the times side
#           by side; quant_e2e_run.sh if expected.json travelled; compute-sanitizer memcheck of a tiny
#           MoE MLX int4 g32 and int8 completion per pair and grouped;
#   30b     a Qwen3-30B-A3B-shaped model (random bf16, /dev/shm), its MLX int4 g64 quantization
#           and the other presets of VARIANTS (`scr quantize`), each quantized model's greedy ids after
#           a 300-token prompt per pair and by default (wide prefill expanded), `scr cuda-bench` of each of VARIANTS:
#           bf16 or a preset name, +grouped forcing the grouped experts (SCR_CUDA_MOE_GEMM=1), +tn1,
#           +tn2, +tn4, +tnexpert or +tnexpert2 the tensor-core form's chunk width (SCR_CUDA_MOE_QMMA_TN), +onestream
#           the per-expert widths' two chains on the step's stream alone (SCR_CUDA_SIDE_STREAM=0);
#   wide    (asked for by name) the 30B's MLX int4 g64 decode at batch 256 (wide steps in a graph)
#           per pair and by default (expanded), then scr_cuda_moe --no-bench under memcheck.
set -u
CARRY=${1:-.moeq-carry}
. tests/cuda/device_lib.sh
device_begin /tmp/scr-moeq-out /tmp/scr-moeq-logs  # tarred into $OUT at the end (the run tool brings back few files)

if [[ " ${PARTS:-checks 30b} " == *" checks "* ]]; then
    device_unpack "$CARRY" /tmp/scr-moeq-bin
    step moe_checks 300 $C/scr_cuda_moe
    grep -E "^FAIL|passed|FAILED|^\|" "$LOGS/moe_checks.txt"
    if [ -n "${BASE:-}" ]; then  # A/B of the experts' times: BASE's scr_cuda_moe and ours, alternating
        N=$C
        device_unpack "$BASE" /tmp/scr-moeq-base
        for r in $(seq ${ROUNDS:-2}); do
            for v in base new; do
                x=$N; [ $v = base ] && x=$C
                step moe_${v}_r$r 240 $x/scr_cuda_moe
                echo "== $v round $r:"; grep -E "^FAIL|FAILED|^\| [0-9]" "$LOGS/moe_${v}_r$r.txt" | head -12
            done
        done
        C=$N
    fi
    if [ -f "$CARRY/expected.json" ]; then
        step quant_e2e 150 env OUT=$OUT/e2e bash tests/cuda/quant_e2e_run.sh "$CARRY"
        tail -n 12 "$LOGS/quant_e2e.txt"
    fi
    F=tests/fixtures/Qwen3MoeForCausalLM
    IDS=$(seq -s, 1 40)
    for p in mlx-int4-g32 int8; do
        step quantize_$p 60 $C/scr quantize $F /tmp/qm-$p --preset $p
        for g in 0 1; do  # SCR_CUDA_MOE_GEMM: 0 per pair (the default), 1 grouped
            step memcheck_${p}_$g 120 env SCR_CUDA_MOE_GEMM=$g compute-sanitizer --tool memcheck --error-exitcode 9 \
                $C/scr complete /tmp/qm-$p --quant $p --ids $IDS --max-tokens 4
            echo "memcheck $p gemm=$g: $(grep -h 'ERROR SUMMARY' "$LOGS/memcheck_${p}_$g.txt")"
        done
    done
fi

if [[ " ${PARTS:-checks 30b} " == *" 30b "* ]]; then
    device_unpack "$CARRY/m30" /tmp/scr-moeq-m30
    make_model 30b  # M=/dev/shm/m30b... as device_lib.sh names it
    [ -f $M/config.json ] || { echo "no 30B model"; printf '%s\n' "${summary[@]}"; exit 1; }
    for v in ${VARIANTS:-mlx-int4-g64 bf16}; do
        p=${v%%+*}
        [ $p = bf16 ] || [ -f $M-$p/config.json ] || step quantize_30b_$p 300 $C/scr quantize $M $M-$p --preset $p
    done
    du -sh $M*
    # A 300-token prompt's prefill is a wide step (2,400 pairs >= 16 per expert): greedy ids with every
    # step per pair (SCR_CUDA_MOE_GEMM=0) beside the default (the prefill's experts expanded to bf16).
    IDS300=$(seq -s, 1000 1299)
    for v in ${VARIANTS:-mlx-int4-g64 bf16}; do
        p=${v%%+*}
        [ $p = bf16 ] || [ $v != $p ] && continue
        step complete_30b_${p}_pairs 120 env SCR_CUDA_MOE_GEMM=0 $C/scr complete $M-$p --quant $p --ids $IDS300 --max-tokens 8
        step complete_30b_${p}_default 120 $C/scr complete $M-$p --quant $p --ids $IDS300 --max-tokens 8
        echo "30b $p greedy ids after 300 tokens: per pair $(tail -n 1 "$LOGS/complete_30b_${p}_pairs.txt"); default $(tail -n 1 "$LOGS/complete_30b_${p}_default.txt")"
    done
    for v in ${VARIANTS:-mlx-int4-g64 bf16}; do
        p=${v%%+*} m=$M e=
        [ $p = bf16 ] || m=$M-$p
        case $v in
        *+grouped) e=SCR_CUDA_MOE_GEMM=1 ;;
        *+tn1 | *+tn2 | *+tn4 | *+tnexpert | *+tnexpert2) e=SCR_CUDA_MOE_QMMA_TN=${v##*+tn} ;;
        *+onestream) e=SCR_CUDA_SIDE_STREAM=0 ;;
        esac
        step bench_30b_$v 170 env $e $C/scr cuda-bench $m --prompt 64 --decode 64 --prefill 2048 --batches ${BATCHES:-16,64} --batch-steps 16
        echo "== 30b $v:"; grep -h '^batch-1 decode\|^decode batch\|^prefill\|floor' "$LOGS/bench_30b_$v.txt" | cut -c1-200
    done
fi
if [[ " ${PARTS:-checks 30b} " == *" wide "* ]]; then  # not in the default PARTS
    device_unpack "$CARRY/m30" /tmp/scr-moeq-m30
    make_model 30b
    p=mlx-int4-g64
    [ -f $M-$p/config.json ] || step quantize_30b_$p 300 $C/scr quantize $M $M-$p --preset $p
    # decode steps of 256 rows (2,048 pairs: wide) inside a captured graph: per pair vs expanded
    for g in 0 default; do
        e=; [ $g = 0 ] && e=SCR_CUDA_MOE_GEMM=0
        step bench_wide_$g 170 env $e $C/scr cuda-bench $M-$p --prompt 64 --decode 16 --prefill 0 --batches 256 --batch-steps 8
        echo "== 30b $p, SCR_CUDA_MOE_GEMM=$g:"; grep -h '^decode batch 256' "$LOGS/bench_wide_$g.txt" | head -2 | cut -c1-160
    done
    # memcheck of every expert check (the expanded wide steps included), no timings
    device_unpack "$CARRY" /tmp/scr-moeq-bin
    step memcheck_moe 400 compute-sanitizer --tool memcheck --error-exitcode 9 $C/scr_cuda_moe --no-bench
    grep -h "ERROR SUMMARY\|passed\|FAILED" "$LOGS/memcheck_moe.txt"
fi
printf '%s\n' "${summary[@]}"
tar -C "$LOGS" -cJf "$OUT/logs.tar.xz" .
