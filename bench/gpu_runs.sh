#!/usr/bin/env bash
# The GPU-host runs behind bench/results/2026-11-22-h100/, in one device call. Needs the CIFAR-10 JPEG
# tarball at .data/cifar10-jpeg.tar.gz (copied from ../shared/data, carried with the call) and
# .deps (scripts/pack-deps.sh). Writes a summary and logs under $OUT (or ./gpu-out).
#   bench/gpu_runs.sh tests small pairs resnet-adam peers-small peers-resnet resnet-sgd experiment
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
L=/tmp/runs/logs  # per-run logs travel back inside runs.tar.gz (the trip back takes 8 files)
mkdir -p $L
log() { echo "$*" | tee -a "$S"; }
DATA=/tmp/cifar10
if [ ! -d $DATA/train ]; then mkdir -p $DATA && tar xzf .data/cifar10-jpeg.tar.gz -C $DATA; fi
scripts/gpu-build.sh >"$L/build.log" 2>&1 || { tail -30 "$L/build.log"; exit 1; }
B=build-gpu
T=$B/examples/ditto-train
log "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit: $(git rev-parse --short=12 HEAD 2>/dev/null || cat .ditto-commit) date: $(date -u +%F)"
common="--dataset cifar10 --data $DATA --quiet --loader-threads 8"
run() {  # name, seconds limit, ditto-train args...
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" $T $common "$@" --out /tmp/runs/$name >"$L/$name.log" 2>&1
  local rc=$?
  log "$name rc=$rc wall=$(( $(date +%s) - start ))s :: $(tail -1 "$L/$name.log")"
  [ -f /tmp/runs/$name/log.csv ] && cat /tmp/runs/$name/log.csv >>"$S"
}
for step in "$@"; do
  case $step in
    tests)
      (cd $B && ctest -L gpu --timeout 300 >"$OUT/gpu-tests.log" 2>&1)
      log "ctest -L gpu: $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log")"
      for t in $B/tests/gpu_*; do $t -s 2>/dev/null | grep -E '^(DETERMINISM|LOADER|GPU) '; done >"$OUT/determinism.txt"
      ;;
    small)
      run smallcnn_adam 300 --model smallcnn --epochs 10 --batch-size 128 --lr 4e-4 --optimizer adam
      ;;
    pairs)
      for r in a b; do
        run det_$r 200 --model smallcnn --epochs 3 --lr 4e-4 --deterministic-init --deterministic-input --deterministic-kernels
      done
      for r in a b; do
        run nondet_$r 200 --model smallcnn --epochs 3 --lr 4e-4 --deterministic-init --deterministic-input --kernels nondeterministic
      done
      log "checkpoint sha256:"; (cd /tmp/runs && sha256sum det_*/checkpoint.safetensors nondet_*/checkpoint.safetensors) | tee -a "$S"
      ;;
    resnet-adam)
      run resnet18_adam 400 --model resnet18 --epochs 3 --batch-size 128 --lr 4e-4 --optimizer adam
      ;;
    resnet-sgd)
      run resnet18_sgd 560 --model resnet18 --epochs 15 --batch-size 128 --lr 0.1 --optimizer sgd --momentum 0.9 \
        --weight-decay 5e-4 --augment --lr-schedule cosine
      ;;
    peers-small)
      timeout 200 python3 bench/peers/torch_train.py --data $DATA --model smallcnn --epochs 3 --optimizer adam --lr 4e-4 \
        >"$L/torch_smallcnn.log" 2>&1; log "torch smallcnn: $(tail -1 "$L/torch_smallcnn.log")"
      ;;
    peers-resnet)
      timeout 300 python3 bench/peers/torch_train.py --data $DATA --model resnet18 --epochs 2 --optimizer adam --lr 4e-4 \
        >"$L/torch_resnet18.log" 2>&1; log "torch resnet18: $(tail -1 "$L/torch_resnet18.log")"
      ;;
    overhead)
      # The cost of determinism: one ResNet-18 epoch per kernels mode (same seeds), and PyTorch
      # with and without torch.use_deterministic_algorithms.
      for k in heuristic deterministic nondeterministic fastest; do
        run overhead_$k 120 --model resnet18 --epochs 1 --lr 4e-4 --deterministic-init --deterministic-input --kernels $k
      done
      timeout 200 python3 bench/peers/torch_train.py --data $DATA --model resnet18 --epochs 2 --optimizer adam --lr 4e-4 \
        --deterministic >"$L/torch_resnet18_det.log" 2>&1; log "torch resnet18 deterministic: $(tail -1 "$L/torch_resnet18_det.log")"
      ;;
    replay)
      # Pins cover every choice: a --kernels deterministic run, replayed from its manifest under a
      # policy that would otherwise pick atomics everywhere, must end bit-identical.
      run replay_src 120 --model smallcnn --epochs 2 --lr 4e-4 --deterministic-init --deterministic-input --kernels deterministic
      run replay_dst 120 --model smallcnn --epochs 2 --lr 4e-4 --deterministic-init --deterministic-input \
        --kernels nondeterministic --pins-from /tmp/runs/replay_src/manifest.json
      (cd /tmp/runs && sha256sum replay_src/checkpoint.safetensors replay_dst/checkpoint.safetensors) | tee -a "$S"
      # The same for a run that chose by timing (--kernels fastest, cuDNN's Find).
      run fastest_src 120 --model smallcnn --epochs 2 --lr 4e-4 --deterministic-init --deterministic-input --kernels fastest \
        --pin '*.bias_bwd=deterministic' --pin '*.bwd=gather' --pin 'loss.reduce=deterministic'
      run fastest_dst 120 --model smallcnn --epochs 2 --lr 4e-4 --deterministic-init --deterministic-input \
        --kernels nondeterministic --pins-from /tmp/runs/fastest_src/manifest.json
      (cd /tmp/runs && sha256sum fastest_src/checkpoint.safetensors fastest_dst/checkpoint.safetensors) | tee -a "$S"
      ;;
    celeba)
      # Subgroup sensitivity: Blond_Hair with Male subgroups on the CelebA subset, SmallCNN.
      CEL=/tmp/celeba
      [ -d $CEL ] || { mkdir -p $CEL && tar xzf .data/celeba64.tar.gz -C $CEL; }
      root=$(dirname "$(find $CEL -name list_attr_celeba.txt | head -1)")
      timeout 300 $B/examples/ditto-experiment --dataset celeba --data "$root" --epochs 3 --replicas 3 \
        --out /tmp/runs/celeba --quiet >"$L/celeba.log" 2>&1
      log "celeba experiment rc=$?"; tail -8 "$L/celeba.log" >>"$S"
      ;;
    opnoise)
      # Per-op micro-experiment on three ResNet-18-like layers (stem, mid, last stage).
      for shp in "128 3 32 64" "128 128 16 128" "128 512 4 512"; do
        set -- $shp
        timeout 200 $B/bench/op_noise --n $1 --c $2 --hw $3 --k $4 --runs 20 --out /tmp/runs/op_noise_$2x$3 \
          >"$L/op_noise_$2x$3.log" 2>&1
        log "op_noise n=$1 c=$2 hw=$3 k=$4 rc=$?"; cat "$L/op_noise_$2x$3.log" >>"$S"
      done
      ;;
    experiment)
      timeout 200 $B/examples/ditto-experiment --out /tmp/runs/experiment --quiet >"$L/experiment.log" 2>&1
      log "experiment rc=$?"; tail -8 "$L/experiment.log" >>"$S"
      ;;
  esac
done
# Run folders (experiment results, CSVs, manifests, logs) without checkpoints (those are hashed
# above), one file for the trip back: at most 8 files come back.
tar czf "$OUT/runs.tar.gz" -C /tmp --exclude='*.safetensors' runs 2>/dev/null
cat "$S"
