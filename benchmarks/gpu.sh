#!/usr/bin/env bash
# Everything a user does on a GPU, in one call on a CUDA machine (planned to take under 8 minutes
# on an H100-class GPU; gpu-commands.md records what it took):
#   1. the user's commands end to end on the CIFAR-10 shards: `vitlab train` for a few hundred
#      steps in bf16 and in fp16 (the fp16 run decoding on the device, data.decode=cuda, and
#      resumed for more steps), `finetune` from the bf16 checkpoint at twice the resolution,
#      `eval`, `predict` (bf16, attention overlays), `export` (ONNX and torch.export), and a
#      one-GPU torchrun;
#   2. `vitlab bench --suite gpu`: ViT-B/16 serving at batch 1 and 256 (fp32, bf16, fp16; bf16
#      compiled with CUDA graphs) and its bf16 training step at batch 256, eager and compiled,
#      beside timm, with MFU against the device's peak (gpu.md, gpu.csv);
#   3. the nvjpeg data path (data.decode=cuda on 500x375 photographs: pipeline-gpu.md);
#   4. benchmarks/gpu_report.py: gpu-commands.md (each command, its exit status, time and
#      result) and gpu-goals.md (the GPU goals against timm in the same run, with a
#      torch.profiler summary of each one that falls short).
# A command that fails does not stop the others; the script exits 1 if any failed.
#
#   benchmarks/gpu.sh                            # on the GPU: results in benchmarks/results/
#   benchmarks/gpu.sh --smoke --out DIR          # tiny sizes: what tests/test_fake_gpu.py runs
#                                                # on a CPU playing the GPU (tests/fake_gpu.py)
# Options: --out DIR (results), --work DIR (runs and logs; default a new temporary folder),
# --data DIR (the CIFAR-10 shards; default ../shared/data/cifar10).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

smoke=0 out=benchmarks/results work="" data=../shared/data/cifar10
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) smoke=1 ;;
        --out) out=$2; shift ;;
        --work) work=$2; shift ;;
        --data) data=$2; shift ;;
        *) echo "usage: benchmarks/gpu.sh [--smoke] [--out DIR] [--work DIR] [--data DIR]" >&2; exit 2 ;;
    esac
    shift
done
work=${work:-$(mktemp -d)}
mkdir -p "$out" "$work/logs"
: >"$work/commands.tsv"
if ! ls "$data"/train-*.tar* >/dev/null 2>&1; then
    echo "gpu.sh: no CIFAR-10 shards in $data (train-*.tar.gz); pass --data DIR" >&2
    exit 2
fi
cifar="wds:$data"

if [ "$smoke" = 1 ]; then
    # A CPU plays the GPU: tiny models, a handful of steps, nothing compiled (compiling for a
    # played GPU would time the CPU's compiler), evaluation on a few extracted test images.
    export TORCHDYNAMO_DISABLE=1
    model=(model.depth=1 model.hidden_size=32 model.num_heads=2 model.mlp_dim=64)
    train=(--steps 6 --batch-size 16 --ckpt-every 3 data.num_workers=1 data.shuffle_buffer=64 data.eval_splits=[] "${model[@]}")
    more=9 per_class=2 finetune_size=48
    finetune=(--steps 3 --batch-size 16 data.num_workers=0 data.shuffle_buffer=64 data.eval_splits=[])
    evaluate=(--data "imagefolder:$work/images" --batch-size 16)
    bench=(--model ViT-C/4 --batch-size 2 --rounds 1 --min-time 0)
    pipeline=(--rounds 1 --batch 16)
else
    # The cifar10 recipe (ViT-C/4 at 32 px, batch 128) with the GPU machine's cores decoding.
    train=(--steps 300 --ckpt-every 100 data.num_workers=8)
    more=400 per_class=8 finetune_size=64
    finetune=(--steps 200 data.num_workers=8)
    evaluate=(--data "$cifar" --batch-size 512 --workers 8)
    bench=(--rounds 3 --min-time 0.5)
    pipeline=(--rounds 3)
fi

since() {  # seconds since a `date +%s.%N` reading
    awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

failed=0
step() {  # step NAME COMMAND...: its output in WORK/logs/NAME.log; name, exit status, seconds, command in commands.tsv
    local name=$1 start rc
    shift
    echo "gpu.sh: $name: $*" >&2
    start=$(date +%s.%N)
    "$@" >"$work/logs/$name.log" 2>&1
    rc=$?
    if [ "$rc" != 0 ]; then
        failed=1
        echo "gpu.sh: $name failed (exit $rc); the end of its log:" >&2
        tail -n 15 "$work/logs/$name.log" >&2
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(since "$start")" "$*" >>"$work/commands.tsv"
}

begin=$(date +%s.%N)
step prepare python benchmarks/gpu_report.py prepare --data "$data" --per-class "$per_class" --out "$work/images"
if [ "$failed" != 0 ]; then
    exit 1  # no GPU, or no test images: nothing else can run
fi
vitlab=(python -m vitlab)
step train-bf16 "${vitlab[@]}" train --config cifar10 --data "$cifar" --device cuda --bf16 --out "$work/bf16" --quiet "${train[@]}"
step train-fp16 "${vitlab[@]}" train --config cifar10 --data "$cifar" --device cuda --fp16 --out "$work/fp16" --quiet \
    data.decode=cuda "${train[@]}"
step resume-fp16 "${vitlab[@]}" train --resume "$work/fp16" --steps "$more" --quiet
step finetune "${vitlab[@]}" finetune "$work/bf16/checkpoints/last.safetensors" --data "$cifar" --device cuda --bf16 \
    --image-size "$finetune_size" --lr 0.01 --out "$work/finetune" --quiet "${finetune[@]}"
tuned="$work/finetune/checkpoints/last.safetensors"  # --lr: no recipe sweep, so no final/ folder
step eval "${vitlab[@]}" eval "$tuned" --split test --device cuda --bf16 --out "$work/eval" "${evaluate[@]}"
step predict "${vitlab[@]}" predict "$tuned" "$work/images/test" --device cuda --precision bf16 --attention "$work/overlays" \
    --csv "$work/predict.csv"
step export-onnx "${vitlab[@]}" export "$tuned" --format onnx --device cuda --out "$work/model.onnx"
step export-program "${vitlab[@]}" export "$tuned" --format torch-export --device cuda --out "$work/model.pt2"
step torchrun python -m torch.distributed.run --standalone --nproc_per_node 1 -m vitlab train --config cifar10 --data "$cifar" \
    --device cuda --bf16 --out "$work/torchrun" --quiet "${train[@]}"
step bench "${vitlab[@]}" bench --suite gpu --device cuda --max-wait 0 --wait-budget 0 --out "$out" --name gpu "${bench[@]}"
step pipeline python benchmarks/pipeline.py --gpu --out "$out" "${pipeline[@]}"
step report python benchmarks/gpu_report.py report --work "$work" --out "$out" \
    --seconds "$(since "$begin")" $([ "$smoke" = 1 ] && echo --smoke)
cat "$out/gpu-commands.md" "$out/gpu-goals.md" 2>/dev/null
echo "gpu.sh: runs and logs in $work" >&2
exit "$failed"
