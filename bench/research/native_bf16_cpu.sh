#!/usr/bin/env bash
# The measurements issues 52 and 55 wait for, on a development machine whose CPU has native bf16 (AMX, or AVX-512
# BF16), one after another on its cores with nothing else running (~1.5 h on 2 AMX cores):
#
#   bash bench/research/native_bf16_cpu.sh OUT_DIR          # from the repository root
#
# Each step writes OUT_DIR/NAME.log and, when it finished, OUT_DIR/NAME.done; a step already done is skipped, so an
# interrupted session runs the script again to continue. The steps:
#   env          the CPU, its flags, PyTorch's view of bf16; refused without native bf16 (FORCE=1 runs it anyway)
#   demo         issue 55: `biodistil demo --out OUT_DIR/demo --record docs/results/demo.json` (3 seeds, ≤ 12 min)
#   soak-no, soak-bf16
#                issue 52: 1,000 steps of bench/research/rss_soak.py's small model in float32 and under bf16 autocast
#                (RSS growth from step 100 to step 1,000, ≤ 2%; where oneDNN runs the matmuls)
#   peak-MODE    issue 52: bench/throughput.py --only MODE at BERT-base shapes (12 × 768 → 6 × 768, 8 × 128, 30,522),
#                one process a mode, 200 steps: the command's own peak RSS and growth per step, biodistil's defaults
#                (live-all, live-masked, cache-head) against the peer (peer-all, peer-masked)
#   speed        issue 52: the same modes alternated in one process, 3 measured rounds: tokens/s against the peer
# What to commit: the demo's record (docs/results/demo.json, then `python docs/results/tables.py --write`) and the
# figures of the other logs (their last JSON lines) in docs/methods.md, with the CPU's flags from env.log.
# A rehearsal anywhere (tiny shapes, no demo, a few steps):
#   FORCE=1 SKIP_DEMO=1 STEPS=20 SOAK_STEPS=30 SHAPES="--teacher-layers 2 --hidden 64 --heads 2 --vocab 1000" \
#       bash bench/research/native_bf16_cpu.sh /tmp/rehearsal
set -u
out=${1:?OUT_DIR}
mkdir -p "$out"
steps=${STEPS:-200}
soak_steps=${SOAK_STEPS:-1000}
read -r -a shapes <<<"${SHAPES:---teacher-layers 12 --hidden 768 --heads 12 --vocab 30522}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timer=()  # GNU time, where installed: each step's wall time and peak RSS as its log's last line
[ -x /usr/bin/time ] && timer=(/usr/bin/time -f "wall %e s, peak RSS %M KB")

step() {  # step NAME COMMAND...: run once, its output in NAME.log, NAME.done when it exited 0
    local name=$1
    shift
    if [ -e "$out/$name.done" ]; then
        echo "$name: done already ($out/$name.log)"
        return 0
    fi
    echo "$name: $* ($(date -u +%H:%M:%S))"
    if "${timer[@]}" "$@" >"$out/$name.log" 2>&1; then
        touch "$out/$name.done"
        tail -n 1 "$out/$name.log"
    else
        echo "$name: failed, see $out/$name.log" >&2
        return 1
    fi
}

flags=$(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
{
    date -u
    grep -m 1 "model name" /proc/cpuinfo
    echo "usable cores: $(nproc)"
    echo "flags: $flags"
    python3 -c "import torch; print('torch', torch.__version__, 'mkldnn bf16', torch.ops.mkldnn._is_mkldnn_bf16_supported(),
'capability', torch.backends.cpu.get_cpu_capability())"
} >"$out/env.log" 2>&1
cat "$out/env.log"
case " $flags " in
    *" avx512_bf16 "* | *" amx_bf16 "*) ;;
    *)
        if [ "${FORCE:-0}" != 1 ]; then
            echo "no native bf16 on this CPU (flags: $flags): its figures would not be the issues' (FORCE=1 runs anyway)" >&2
            exit 2
        fi
        ;;
esac

set -e
if [ "${SKIP_DEMO:-0}" != 1 ]; then
    step demo biodistil demo --out "$out/demo" --record docs/results/demo.json
fi
for precision in no bf16; do
    step "soak-$precision" python3 bench/research/rss_soak.py --steps "$soak_steps" --every 100 --from 100 \
        --precision "$precision"
done
for mode in live-all live-masked cache-head peer-all peer-masked; do
    step "peak-$mode" python3 bench/throughput.py --device cpu --only "$mode" "${shapes[@]}" --seq 128 --batch 8 \
        --repeats "$steps" --warmup 1
done
step speed python3 bench/throughput.py --device cpu "${shapes[@]}" --seq 128 --batch 8 --repeats 3 --warmup 1 \
    --modes mlm live-all live-masked cache-head peer-all peer-masked
echo "all steps done: $out"
