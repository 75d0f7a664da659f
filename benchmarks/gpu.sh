#!/usr/bin/env bash
# One short run on a CUDA machine (about 5 minutes on an H100-class GPU, most of it compiling):
# ViT-B/16 serving at batch 1 and 256 in fp32, bf16 and fp16 (and bf16 compiled with CUDA
# graphs) and its bf16 training step at batch 128 (eager and compiled), beside timm, with MFU
# against the device's peak. Writes benchmarks/results/gpu.md and gpu.csv; then the GPU data
# path (pipeline-gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print(torch.cuda.get_device_name())"
python -m vitlab bench --suite gpu --device cuda --rounds 3 --min-time 0.5 --max-wait 0 --wait-budget 0 \
    --out benchmarks/results --name gpu
# The data path on the device (data.decode=cuda: nvjpeg decoding, crop, resize, flip and
# normalisation of a batch of 128 photographs at 500x375): writes benchmarks/results/pipeline-gpu.md
python benchmarks/pipeline.py --gpu --rounds 3
