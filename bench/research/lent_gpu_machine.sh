#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool; docs/gpu.md): bench/gpu_check.py on the GPU, pinned to cores 0-5,
# and beside it issue 52's CPU measurements on the machine's other cores, each pinned to 2 of them with the GPU
# hidden — that machine's CPU may have the native bf16 (avx512_bf16 or AMX) that the development machines lack.
#
#   bash bench/research/lent_gpu_machine.sh OUT_DIR [SECONDS_OF_SOAK]      # from the repository root, wheels in .whl/
#
# Writes to OUT_DIR: env.log (CPU, flags, GPU, versions), gpu-check.jsonl and gpu-check.log, cpu-issue52.log (the
# throughput bench against the peer at BERT-base shapes, then one block per soak: its progress lines and summary).
# A rehearsal anywhere (tiny shapes, the CPU, every job on the machine's own cores):
#   SHAPES="--teacher-layers 2 --hidden 64 --heads 2 --vocab 1000" GPU_CHECK="--device cpu --tiny" \
#       bash bench/research/lent_gpu_machine.sh /tmp/rehearsal 20
set -u
out=${1:?OUT_DIR}
seconds=${2:-300}
mkdir -p "$out"
work=$(mktemp -d)

deps="import pydantic, datasets, seqeval, syntok, bioc, nervaluate"
if ! python3 -c "$deps" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then  # biodistil's own dependencies
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD/src
else
    export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

{
    date -u
    lscpu | grep -E "Model name|Socket|Core|Thread|NUMA node\(s\)|L3"
    echo "usable cores: $(nproc)"
    echo "bf16 flags: $(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    ldd --version | head -1
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'mkldnn bf16', torch.ops.mkldnn._is_mkldnn_bf16_supported(), 'cuda', torch.cuda.is_available())"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} >"$out/env.log" 2>&1

pin() {  # the cores asked for on a machine of 16 or more, else all of this one's
    if [ "$(nproc)" -ge 16 ]; then echo "$1"; else echo "0-$(($(nproc) - 1))"; fi
}

# shellcheck disable=SC2086  # GPU_CHECK and SHAPES are option lists
timeout 450 taskset -c "$(pin 0-5)" python3 bench/gpu_check.py ${GPU_CHECK:-} --section-timeout 240 --out "$out/gpu-check.jsonl" \
    >"$out/gpu-check.log" 2>&1 &

read -r -a shapes <<<"${SHAPES:---teacher-layers 12 --hidden 768 --heads 12 --vocab 30522}"
soak() {  # soak NAME CORES [VAR=VALUE ...] -- [rss_soak options]
    local name=$1 cores=$2
    shift 2
    local settings=()
    while [ "$1" != "--" ]; do settings+=("$1"); shift; done
    shift
    env CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 "${settings[@]}" timeout $((seconds + 120)) taskset -c "$(pin "$cores")" \
        python3 bench/research/rss_soak.py --steps 100000 --seconds "$seconds" --every 10 --from 20 "${shapes[@]}" \
        --block 128 --batch 8 --compile false "$@" >"$work/soak-$name.log" 2>&1
}

soak float32 8,9 -- --precision no &
soak bf16 10,11 -- --precision bf16 &
soak bf16-mmap-threshold 12,13 MALLOC_MMAP_THRESHOLD_=1048576 -- --precision bf16 &
soak bf16-small-onednn-caches 14,15 LRU_CACHE_CAPACITY=16 ONEDNN_PRIMITIVE_CACHE_CAPACITY=16 -- --precision bf16 &
(
    env CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 timeout 150 taskset -c "$(pin 6,7)" python3 bench/throughput.py --device cpu \
        "${shapes[@]}" --seq 128 --batch 8 --repeats 3 --warmup 1 \
        --modes mlm live-all live-masked cache-head peer-all peer-masked >"$work/throughput.log" 2>&1
) &
wait

{
    echo "### throughput (BERT-base shapes, 8 x 128, 2 cores: 6,7)"
    grep -v -E "it/s\]|^\s*$" "$work/throughput.log"
    for log in "$work"/soak-*.log; do
        echo "### $(basename "$log" .log)"
        grep -E '^\{' "$log"
        grep -E "Error|error|Killed" "$log" | tail -5
    done
} >"$out/cpu-issue52.log"
tail -40 "$out/gpu-check.log"
cat "$out/cpu-issue52.log" | grep -v '"step"'
