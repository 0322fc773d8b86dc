#!/usr/bin/env bash
# GPU-host runs as a background pipeline that outlives one device call (each call may run 10
# minutes; a pipeline may take longer):
#   bench/gpu_pipeline.sh start STEP...   build, then run the steps in the background (setsid)
#   bench/gpu_pipeline.sh wait SECONDS    follow the log until the pipeline ends or time is up
#   bench/gpu_pipeline.sh collect         results (no checkpoints) into $OUT
# Steps of the noise lab: gputests quicktest diverge smallcnn resnet-screen resnet-confirm record
# compare. Steps of the speed measurements: graphtest steptime concurrent[:N] concurrent-eager[:N] (N
# replicas at a time, default 10) profile where. Steps of the experiment protocols: exp-smallcnn
# exp-precision[:MODEL] (the four settings in each precision, EXP_PRECISIONS), exp-codebases[:MODEL/EPOCHS/REPLICAS]
# (the four settings in ditto and in PyTorch, side by side; ditto adds IMPL and ALGO+IMPL under its pytorch
# mode), eval-invariance (batch-invariant evaluation's cost), layer-kernels[:MODEL] (the kernels PyTorch and
# ditto's modes run, side by side), attribute-precision[:PRECISION]
# (the add-one attribution in a reduced precision), grad-agreement (one step's gradients against PyTorch's autocast),
# fingerprint[:PRECISIONS] (a deterministic run's weights twice per precision, to compare across GPUs)
# scatter-torch-recheck (the sorted scatters' and ditto.torch's GPU tests and timings, after a change to either)
# Tracing: trace-speed (bench/trace_speed), diverge-zoo[:MODELS] (ImageNet-shape diverge runs with
# per-layer growth), trace-record (a trace per GPU; COMPARE_WITH another host's to compare).
# fig-s4 overhead mnist (needs .data/mnist/*.gz) celeba (needs .data-celeba/celeba64.tar.gz).
# Sanitizers and per-op noise: memcheck[:SECONDS] racecheck[:SECONDS] racecheck-ditto[:SECONDS]
# racecheck-cases[:SECONDS] (RACECHECK_BINS) opnoise (OPNOISE_BIN, OPNOISE_TAG) opnoise-amp (conv and
# linear rows in every precision and layout).
# The cost of determinism per zoo model, ditto and PyTorch: zoo-overhead[:MODELS]. Every row with a goal
# of free determinism in one session (bench/free_det_table.py): free-det, then free-det-ncu (per-kernel profiles).
# Reduced precision, ditto against PyTorch's AMP: precision (fp32, bf16, fp16; CIFAR shapes and a few
# zoo models; under $R/precision); precision-zoo[:MODELS] (the whole zoo in bf16 and fp16, models dealt over ZOO_GPUS).
# The paper's figure S4 and main table: fig-s4[:MOMENTUM[/KERNELS]] fig-s4-resnet18[:MOMENTUM] recipe-resnet18
# exp-resnet18[:adam] exp-optim (each says its wall time and the env vars that scale it); zoo-overhead times
# OVERHEAD_STEPS (100) steps.
# The networks of the other task kinds: tasks[:MODELS] (MODELS a comma list of
# unet-small, stn, ctc-cnn, embedding-bag; default all four), each the four settings and an add-one
# attribution (needs .data/mnist/*.gz and .data-celeba/celeba64.tar.gz); task-ops (op_noise's rows for
# those networks' ops beside the PyTorch peers, bench/task_ops_table.py).
# Data parallelism on one GPU: dp1 (ResNet-18 CIFAR-10: the plain trainer and the data-parallel path with
# one rank under each all-reduce, weights fingerprints and images/s); ddp (on every GPU count
# 1, 2, 4 the host has: ditto under fixed-order and nccl-default, twice each, and PyTorch DDP).
# Needs .data/cifar10-jpeg.tar.gz and .deps (scripts/device-prep.sh), carried with the call.
set -uo pipefail
cd "$(dirname "$0")/.."
R=/tmp/gpurun
B=build-gpu
DATA=/tmp/cifar10
LOG=$R/pipeline.log
cmd=${1:-}; shift || true

pipeline() {
  local A=$B/examples/ditto-attribute D=$B/examples/ditto-diverge E=$B/examples/ditto-experiment
  local cifar="--dataset cifar10 --data $DATA --loader-threads 6"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit: $(cat .ditto-commit) date: $(date -u +%F)"
  for step in "$@"; do
    echo "=== $step $(date -u +%T)"
    local arg=""; [[ $step == *:* ]] && arg=${step#*:} && step=${step%%:*}
    case $step in
      gputests)
        (cd $B && ctest -L gpu --timeout 600 > $R/gpu-tests.log 2>&1); grep -E "tests passed|tests failed|Failed|\*\*\*" $R/gpu-tests.log
        # The tests' own report lines (printed, not asserted). Not with -s: a test with many
        # assertions (gpu_mnist) then prints each of them for minutes.
        for t in $B/tests/gpu_*; do timeout 300 $t 2>/dev/null | grep -E '^(DETERMINISM|LOADER|GPU|NOISELAB|GRAPH|TUNING|TASKS) '; done \
          > $R/determinism.txt ;;
      quicktest)
        $B/tests/gpu_noise_lab > $R/gpu_noise_lab.log 2>&1; tail -3 $R/gpu_noise_lab.log ;;
      diverge)
        local base="--model smallcnn $cifar --lr 4e-4 --optimizer adam --steps 300 --eval-every 10 --quiet"
        $D run $base --kernels deterministic --pin conv2.bwd_filter=algo0 --out $R/diverge/conv2-algo0 > $R/diverge-conv2-algo0.txt 2>&1
        $D run $base --kernels deterministic --measure-overhead --out $R/diverge/deterministic > $R/diverge-deterministic.txt 2>&1
        $D run $base --kernels heuristic --out $R/diverge/heuristic > $R/diverge-heuristic.txt 2>&1
        $D run $base --kernels nondeterministic --out $R/diverge/nondeterministic > $R/diverge-nondeterministic.txt 2>&1
        head -4 $R/diverge-*.txt ;;
      smallcnn)
        # The two forms run side by side (SmallCNN is launch-bound: two processes barely meet
        # on the GPU); their ms/step are therefore measured under that load.
        local s="--model smallcnn $cifar --epochs 10 --lr 4e-4 --optimizer adam --replicas 3 --l2-steps 1,10,100 --fingerprint-steps 4000 --quiet"
        $A $s --form add-one --out $R/smallcnn > $R/smallcnn-add-one.txt 2> $R/smallcnn-add-one.err &
        $A $s --form leave-one-out --out $R/smallcnn > $R/smallcnn-leave-one-out.txt 2> $R/smallcnn-leave-one-out.err &
        wait; tail -n 2 $R/smallcnn-*.err ;;
      resnet-screen)
        $A --model resnet18 $cifar --steps 50 --test-size 2000 --lr 4e-4 --optimizer adam --replicas 2 \
          --l2-steps 1,10,50 --fingerprint-steps 50 --no-checkpoint --quiet --out $R/resnet-screen \
          > $R/resnet-screen.txt 2> $R/resnet-screen.err; tail -2 $R/resnet-screen.err ;;
      resnet-confirm)
        # The screen's three highest-ranked single-layer candidates (TOP, or read from the
        # screen's attribution.csv), trained 3 full epochs.
        local top=${TOP:-$(awk -F'"' 'NR>1 && $0 ~ /,candidate,ok,/ {print $2}' $R/resnet-screen/add-one/attribution.csv | head -3 | paste -sd, -)}
        echo "top 3 of the screen: $top"
        $A --model resnet18 $cifar --epochs 3 --lr 4e-4 --optimizer adam --replicas 3 --candidate "$top" \
          --l2-steps 1,10,100 --fingerprint-steps 1200 --no-checkpoint --quiet --out $R/resnet-confirm \
          > $R/resnet-confirm.txt 2> $R/resnet-confirm.err; tail -2 $R/resnet-confirm.err ;;
      record)
        $D record --model smallcnn $cifar --lr 4e-4 --steps 50 --kernels deterministic --trace $R/smallcnn-det-50.trace --quiet ;;
      compare)
        for f in .carry/*.trace; do [ -f "$f" ] && $D compare "$f" $R/smallcnn-det-50.trace; done ;;
      graphtest)
        $B/tests/gpu_graph > $R/gpu_graph.log 2>&1; grep -E "^GRAPH|passed|failed" $R/gpu_graph.log ;;
      steptime)
        # ditto and the PyTorch peer in the same call; the table script renders both. TF32, once modes
        # of their own, is a precision (STEPTIME_PRECISIONS, default fp32,tf32).
        rm -f $R/step_time.jsonl $R/torch_step_time.jsonl
        local sp=${STEPTIME_PRECISIONS:-fp32,tf32}
        $B/bench/step_time --precisions $sp --out $R/step_time.jsonl --tuning-dir $R/tuning > /dev/null 2> $R/step_time.err
        echo "step_time rc=$?"; grep -E "^BITS" $R/step_time.err
        python3 bench/peers/torch_step_time.py --precisions $sp --out $R/torch_step_time.jsonl > /dev/null \
          2> $R/torch_step_time.err
        echo "torch_step_time rc=$?"; tail -2 $R/torch_step_time.err
        python3 bench/step_time_table.py $R/step_time.jsonl $R/torch_step_time.jsonl --out $R/step_time.md \
          --csv $R/step_time.csv; sed -n '/## Targets/,/## Roofline/p' $R/step_time.md ;;
      concurrent|concurrent-eager)
        # The paper's protocol at SmallCNN scale: 4 settings x 10 replicas x 10 epochs.
        local g="--graph --tuning $R/smallcnn-tuning.json"; [ $step = concurrent-eager ] && g=""
        local t0=$(date +%s)
        $B/examples/ditto-experiment --model smallcnn --dataset cifar10 --data $DATA --loader-threads 2 --epochs 10 --replicas 10 --concurrent ${arg:-10} $g \
          --lr 4e-4 --optimizer adam --quiet --out $R/$step-${arg:-10} > $R/$step-${arg:-10}.txt 2> $R/$step.err
        echo "$step rc=$? wall $(( $(date +%s) - t0 ))s"; tail -8 $R/$step-${arg:-10}.txt ;;
      profile)
        # What is in the way of the targets: per-algorithm times at ResNet-18's shapes where the
        # tuned deterministic choice differs from fastest, and a kernel summary per mode.
        local sh
        for sh in "128 3 32 64 3 1" "128 64 32 128 3 2" "128 64 32 128 1 2" "128 128 16 256 3 2" "128 256 8 512 3 2" \
                  "128 128 16 128 3 1"; do
          set -- $sh
          $B/bench/op_noise --n $1 --c $2 --hw $3 --k $4 --r $5 --stride $6 --runs 10 --out $R/op_time/n$1c$2hw$3k$4r$5s$6 > /dev/null 2>&1
          echo "op_noise $sh rc=$?"
        done
        # Kernels per graphed step and their families (bench/ncu_step_table.py), ditto's modes and PyTorch's
        # default, under Nsight Compute at the GPU's own clocks (each kernel alone: compare launch counts
        # and families, not the sum with the wall time).
        local m P=${PYTHON:-/opt/torch/.venv/bin/python3}
        for m in "smallcnn deterministic-tuned" "smallcnn fastest" "resnet18 deterministic-tuned" "resnet18 fastest"; do
          set -- $m
          ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base $B/bench/step_time \
            --models $1 --modes $2 --graph graph --warmup 2 --steps 3 --tuning-dir $R/tuning > $R/ncu-$1-$2.csv 2> $R/ncu.err
          echo "ncu $m rc=$?"
        done
        for m in smallcnn resnet18; do
          ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base $P bench/peers/torch_step_time.py \
            --models $m --modes default --warmup 2 --steps 3 > $R/ncu-$m-torch-default.csv 2>> $R/ncu.err
          echo "ncu $m torch rc=$?"
        done
        python3 bench/ncu_step_table.py $R/ncu-*.csv --json $R/ncu_steps.json > $R/ncu_steps.md; head -12 $R/ncu_steps.md ;;
      exp-smallcnn)
        # The paper's settings on SmallCNN CIFAR-10 (Adam 4e-4, 10 epochs, 5 replicas).
        $E --model smallcnn --dataset cifar10 --data $DATA --loader-threads 2 --epochs 10 --lr 4e-4 --optimizer adam \
          --replicas 5 --settings ALGO+IMPL,ALGO,IMPL,IMPL-ATOMIC,CONTROL --concurrent 25 --graph --quiet \
          --out $R/exp-smallcnn > $R/exp-smallcnn.txt 2> $R/exp-smallcnn.err; echo "rc=$?"; tail -10 $R/exp-smallcnn.txt ;;
      exp-codebases)
        # The four settings in two code bases on CIFAR-10, same recipe (SmallCNN: Adam 4e-4, no
        # augmentation; ResNet-18: its recipe of exp-resnet18, SGD Nesterov with weight decay, pad-4 crop
        # and flip, one-cycle with a 3-epoch warm-up, batch 256), the same replica seeds and batch order: ditto-experiment, then bench/peers/torch_settings.py
        # (PyTorch, ditto's order through the Python package, which the build must include: carry
        # .whl), then bench/settings_compare.py side by side. exp-codebases:MODEL/EPOCHS/REPLICAS
        # (default smallcnn/10/3). Wall: SmallCNN about 1 min in ditto (graphed, concurrent), 3-4 min
        # in PyTorch (one replica at a time) at 10 epochs x 3 replicas (estimate). GPUS (1) spreads
        # both code bases' replicas over that many GPUs (the peer: one worker process per GPU).
        local model epochs replicas devices=""
        IFS=/ read -r model epochs replicas <<< "$arg"
        model=${model:-smallcnn}; epochs=${epochs:-10}; replicas=${replicas:-3}
        local dir=$R/exp-codebases-$model recipe="--optimizer adam --lr 4e-4"
        [ "$model" = resnet18 ] && recipe="--optimizer sgd --momentum 0.9 --nesterov --weight-decay 5e-4 --augment \
          --lr-schedule onecycle --warmup-epochs 3 --batch-size 256 --lr 0.2"
        mkdir -p $dir
        $E --model $model --dataset cifar10 --data $DATA --loader-threads 2 --epochs $epochs $recipe \
          --replicas $replicas --settings ALGO+IMPL,ALGO,IMPL,CONTROL --concurrent 18 --gpus ${GPUS:-1} --graph --quiet --resume \
          --setting "ALGO+IMPL-pytorch: seeds=random kernels=pytorch" --setting "IMPL-pytorch: seeds=fixed kernels=pytorch" \
          --out $dir/ditto > $dir/ditto.txt 2> $dir/ditto.err; echo "ditto rc=$?"
        [ "${GPUS:-1}" -gt 1 ] && devices="--devices $(seq -s, -f 'cuda:%g' 0 $(( GPUS - 1 )))"
        PYTHONPATH=$B/python${PYTHONPATH:+:$PYTHONPATH} python3 bench/peers/torch_settings.py --data $DATA --model $model \
          --epochs $epochs --replicas $replicas $recipe $devices --out $dir/torch \
          > $dir/torch.txt 2> $dir/torch.err
        echo "torch rc=$?"; tail -4 $dir/torch.txt
        python3 bench/settings_compare.py --ditto $dir/ditto/report.csv --torch $dir/torch/report.csv --out $dir/compare.md \
          && cat $dir/compare.md ;;
      exp-precision)
        # The four settings on CIFAR-10 (Adam 4e-4, EXP_PREC_EPOCHS 10 epochs, EXP_PREC_REPLICAS 5
        # replicas, EXP_PREC_CONCURRENT 20 at a time, graphed) in each of EXP_PRECISIONS
        # (fp32,tf32,bf16,fp16), the same recipe in each: does reduced precision add churn, is there
        # IMPL noise with the kernels a framework picks in bf16? Then bench/precision_noise_table.py
        # over the runs. exp-precision:MODEL[/PRECISIONS[/EPOCHS[/REPLICAS]]] (PRECISIONS joined by
        # "+") trains MODEL (default smallcnn) into $R/exp-precision-MODEL, overriding the variables.
        # Wall: SmallCNN about 45 s per precision; ResNet-18 with 3 epochs and 3 replicas about 5 min
        # in fp32, 1.5-2 min in each of bf16 and fp16 (estimate).
        # EXP_PREC_NATIVE=1: bf16/fp16 runs hand bf16/f16 channels-last activations between layers
        # (--channels-last --native-activations).
        local p runs="" model precs epochs replicas native
        IFS=/ read -r model precs epochs replicas <<< "$arg"
        model=${model:-smallcnn}; precs=${precs//+/,}
        local dir=$R/exp-precision${arg:+-$model}
        for p in $(echo ${precs:-${EXP_PRECISIONS:-fp32,tf32,bf16,fp16}} | tr , ' '); do
          native=""; [[ -n ${EXP_PREC_NATIVE:-} && ( $p == bf16 || $p == fp16 ) ]] && native="--channels-last --native-activations"
          $E --model $model --dataset cifar10 --data $DATA --loader-threads 2 --epochs ${epochs:-${EXP_PREC_EPOCHS:-10}} \
            --lr 4e-4 --optimizer adam --precision $p $native --replicas ${replicas:-${EXP_PREC_REPLICAS:-5}} \
            --settings ALGO+IMPL,ALGO,IMPL,CONTROL \
            --concurrent ${EXP_PREC_CONCURRENT:-20} --graph --quiet --resume --out $dir/$p > $dir-$p.txt 2> $dir-$p.err
          echo "$model $p rc=$?"; runs="$runs $p=$dir/$p"
        done
        python3 bench/precision_noise_table.py $runs --out $dir/table.md && cat $dir/table.md ;;
      attribute-precision)
        # Which kernels carry the IMPL noise left in a reduced precision (ARG, default bf16): the
        # add-one attribution on SmallCNN CIFAR-10 (each nondeterministic framework default alone on
        # top of deterministic kernels), ATTR_PREC_REPLICAS (3) replicas x ATTR_PREC_STEPS (600) steps.
        local p=${arg:-bf16} steps=${ATTR_PREC_STEPS:-600}
        $A --model smallcnn $cifar --steps $steps --lr 4e-4 --optimizer adam --precision $p \
          --replicas ${ATTR_PREC_REPLICAS:-3} --form add-one --l2-steps 1,10,$steps --fingerprint-steps $steps \
          --no-checkpoint --overwrite --quiet --out $R/attribute-$p > $R/attribute-$p.txt 2> $R/attribute-$p.err
        echo "attribute $p rc=$?"; sed -n '/^rank/,/^$/p' $R/attribute-$p.txt | head -24 ;;
      eval-invariance)
        # What batch-invariant evaluation costs and buys (bench/eval_invariance): SmallCNN and ResNet-18 at
        # 32 px over 1000 examples in batches of 1000, 128, 7 and 1; ResNet-50 at 224 px over 256 in
        # batches of 256, 64, 7 and 1; fastest, heuristic and batch-invariant kernels. Wall: about 3 min.
        rm -f $R/eval_invariance.jsonl
        timeout 200 $B/bench/eval_invariance --models smallcnn,resnet18 --image-size 32 --examples 1000 \
          --batches 1000,128,7,1 --repeats 2 --out $R/eval_invariance.jsonl > /dev/null 2> $R/eval_invariance.err
        echo "eval_invariance 32px rc=$?"
        timeout 200 $B/bench/eval_invariance --models resnet50 --image-size 224 --examples 256 --batches 256,64,7,1 \
          --repeats 2 --out $R/eval_invariance.jsonl > /dev/null 2>> $R/eval_invariance.err
        echo "eval_invariance 224px rc=$?"
        python3 bench/eval_invariance_table.py $R/eval_invariance.jsonl --out $R/eval_invariance.md && cat $R/eval_invariance.md ;;
      layer-kernels)
        # The kernels PyTorch runs by default beside ditto's pytorch, heuristic and deterministic modes
        # for the same work (ARG: smallcnn or resnet18, default smallcnn): two training steps of 128 and
        # one evaluation batch of 128; PyTorch's profiler and Nsight Compute; bench/layer_kernels.py.
        local model=${arg:-smallcnn} K=$R/layer-kernels-${arg:-smallcnn} m ncu; ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        mkdir -p $K
        timeout 120 python3 bench/peers/torch_kernels.py --model $model --out $K/torch.json 2>&1 | tail -1
        for m in pytorch heuristic deterministic; do
          timeout 180 $ncu --csv --metrics gpu__time_duration.sum --log-file $K/ditto-$m.csv $B/examples/ditto-train \
            --model $model --dataset synthetic --synthetic-train 256 --synthetic-test 128 --synthetic-size 32 \
            --batch-size 128 --epochs 1 --kernels $m --deterministic-init --deterministic-input --quiet --loader-threads 1 \
            > $K/ditto-$m.txt 2>&1
          echo "ncu $m rc=$?"
        done
        python3 bench/layer_kernels.py $K/torch.json pytorch=$K/ditto-pytorch.csv heuristic=$K/ditto-heuristic.csv \
          deterministic=$K/ditto-deterministic.csv --out $K/table.md && head -8 $K/table.md ;;
      fingerprint)
        # A deterministic run's final weights, twice per precision (ARG: precisions joined by "+",
        # default bf16+fp16): SmallCNN on CIFAR-10, 2 epochs, Adam 4e-4, graphed, channels-last,
        # every seed and kernel deterministic (fp16 with its default dynamic loss scaling). Lines
        # "FINGERPRINT <gpu> <precision> <run> <weights fingerprint>": equal within a precision means
        # run-to-run; compared with another host's lines, GPU-to-GPU.
        local p i rc gpu; gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' _)
        for p in $(echo ${arg:-bf16+fp16} | tr + ' '); do
          for i in 1 2; do
            $B/examples/ditto-train --model smallcnn $cifar --epochs 2 --lr 4e-4 --optimizer adam --precision $p \
              --channels-last --graph --deterministic-init --deterministic-input --deterministic-kernels --quiet \
              --out $R/fingerprint/$p-$i > $R/fingerprint-$p-$i.txt 2> $R/fingerprint-$p-$i.err
            rc=$?
            echo "FINGERPRINT $gpu $p $i $(grep -o 'weights fingerprint [0-9a-f]*' $R/fingerprint-$p-$i.txt | cut -d' ' -f3) rc=$rc"
          done
        done | tee $R/fingerprints.txt ;;
      grad-agreement)
        # One step's gradients in fp32, bf16 and fp16 from the same weights and batch, ditto against
        # PyTorch's autocast, both measured against an fp64 reference (bench/grad_agreement.cpp,
        # bench/peers/torch_grad_agreement.py say how and the tolerance). Wall: under a minute.
        # GRAD_NATIVE=1: ditto's bf16/fp16 steps run channels-last with native activations.
        local G=$R/grad-agreement${GRAD_NATIVE:+-native}; mkdir -p $G
        $B/bench/grad_agreement --models ${GRAD_MODELS:-smallcnn,resnet18,resnet50} --precisions fp32,bf16,fp16 \
          ${GRAD_NATIVE:+--channels-last --native-activations} \
          --batch 32 --image-size 32 --out $G/files > $G/ditto.txt 2> $G/ditto.err; echo "grad_agreement rc=$?"
        python3 bench/peers/torch_grad_agreement.py --dir $G/files --models ${GRAD_MODELS:-smallcnn,resnet18,resnet50} \
          --out $G/agreement.jsonl --md $G/agreement.md > $G/torch.txt 2> $G/torch.err
        echo "torch_grad_agreement rc=$?"; cat $G/agreement.md; tail -3 $G/torch.err ;;
      trace-speed)
        # What tracing costs (bench/trace_speed: untraced eager, untraced graphed, traced as
        # ditto-diverge record traces): ResNet-18 and ResNet-50 on CIFAR-shaped batches of 128, then
        # ResNet-50 and DenseNet-121 at ImageNet shape (224 px, batch 32). Wall: about 2 min.
        $B/bench/trace_speed --models resnet18,resnet50 --batch 128 --image-size 32 --steps 40 \
          --out $R/trace_speed.jsonl > $R/trace-speed.txt 2>&1; echo "cifar shape rc=$?"
        $B/bench/trace_speed --models resnet50,densenet121 --batch 32 --image-size 224 --steps 20 \
          --out $R/trace_speed.jsonl >> $R/trace-speed.txt 2>&1; echo "imagenet shape rc=$?"
        cat $R/trace_speed.jsonl; tail -3 $R/trace-speed.txt ;;
      diverge-zoo)
        # ditto-diverge run at ImageNet shape on the framework-default kernels, with per-layer growth:
        # ARG models (default resnet50,densenet121; joined by +), synthetic 224-px images, batch 32,
        # DIVERGE_ZOO_STEPS (30) steps, Adam 4e-4, plus the untraced run (--measure-overhead).
        local m
        for m in $(echo ${arg:-resnet50+densenet121} | tr + ' '); do
          $D run --model $m --dataset synthetic --synthetic-train 1024 --synthetic-test 64 --synthetic-size 224 \
            --batch-size 32 --lr 4e-4 --optimizer adam --kernels heuristic --steps ${DIVERGE_ZOO_STEPS:-30} \
            --eval-every 10 --measure-overhead --quiet --out $R/diverge-$m > $R/diverge-$m.txt 2>&1
          echo "$m rc=$?"; head -16 $R/diverge-$m.txt; tail -3 $R/diverge-$m.txt
        done ;;
      trace-record)
        # A trace to compare across GPUs (ditto-diverge record): ResNet-18 on CIFAR-shaped synthetic
        # data, batch 128, 20 steps, deterministic kernels, into $R/traces/<gpu>.trace; with
        # COMPARE_WITH (a trace from another host, carried in), ditto-diverge compare against it.
        local gpu; gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' _)
        mkdir -p $R/traces
        $D record --model resnet18 --dataset synthetic --synthetic-train 2560 --synthetic-test 128 --synthetic-size 32 \
          --batch-size 128 --lr 4e-4 --optimizer adam --kernels deterministic --steps 20 --quiet --overwrite \
          --trace $R/traces/$gpu.trace > $R/trace-record.txt 2>&1; echo "record rc=$?"; cat $R/trace-record.txt
        if [ -n "${COMPARE_WITH:-}" ]; then
          $D compare "$COMPARE_WITH" $R/traces/$gpu.trace > $R/trace-compare.txt 2>&1; echo "compare rc=$?"
          cat $R/trace-compare.txt
        fi ;;
      fig-s4)
        # Figure S4 with GPU noise: SmallCNN, CIFAR-10, SGD with momentum ARG (fig-s4 =
        # 0, fig-s4:0.9), constant lr, no augmentation; per lr the four {init} x {order} cells on
        # the framework-default (heuristic) kernels and a CONTROL cell (deterministic, nothing
        # varies: the zero line), 3 replicas each. Default lrs: 0.01,0.05,0.1 at momentum 0 and
        # the same effective rates lr/(1-m) at 0.9 (0.001,0.005,0.01; 0.1 at momentum 0.9 is an
        # effective 1.0, where SmallCNN without batch norm may diverge). FIG_S4_LRS,
        # FIG_S4_EPOCHS (30: near the plateau at lr 0.01), FIG_S4_REPLICAS override.
        # Wall: 15 cells x 3 replicas x 30 epochs = 1350 replica-epochs at about 0.13 s each with
        # 15 at a time graphed (measured earlier: 400 in 52 s) -> about 3-4 min per momentum.
        # fig-s4:M/KERNELS runs the four cells on another mode's kernels (pytorch: what PyTorch's
        # default picks) into fig-s4-mM-KERNELS. GPUS (1) spreads the replicas over that many GPUs.
        local m k lrs name
        IFS=/ read -r m k <<< "$arg"; m=${m:-0}; name=fig-s4-m$m${k:+-$k}
        if [ -n "${FIG_S4_LRS:-}" ]; then lrs=$FIG_S4_LRS; elif [ "$m" = 0 ]; then lrs=0.01,0.05,0.1; else lrs=0.001,0.005,0.01; fi
        $E --protocol fig-s4 --momentum $m --lrs $lrs --model smallcnn --dataset cifar10 --data $DATA --loader-threads 2 \
          --epochs ${FIG_S4_EPOCHS:-30} --replicas ${FIG_S4_REPLICAS:-3} --concurrent 15 --gpus ${GPUS:-1} --graph \
          ${k:+--fig-s4-kernels $k} --tuning $R/smallcnn-tuning.json --quiet --out $R/$name > $R/$name.txt 2> $R/$name.err
        echo "rc=$?"; tail -18 $R/$name.txt
        grep -h '"test_top1"' $R/$name/*/manifest.json | sort | sed -n '1p;$p' ;;
      fig-s4-resnet18)
        # Figure S4 for ResNet-18 (CIFAR-10, SGD momentum ARG, no augmentation, constant lr), as
        # many lrs and epochs as the device time allows: FIG_S4_R18_LRS (0.02,0.1),
        # FIG_S4_R18_EPOCHS (3), FIG_S4_R18_REPLICAS (2; with 2 replicas "not all agree" is the
        # churn). Wall: 2 lrs x 5 cells x 2 replicas x 3 epochs = 60 replica-epochs at about 7 s
        # (heuristic 17.5 ms/step graphed, 391 steps, evaluation) -> about 7 min; each added lr
        # about +3.5 min, each added epoch about +2.3 min. GPUS (1) spreads the replicas over that many
        # GPUs, FIG_S4_R18_CONCURRENT (4) at a time on each.
        local m=${arg:-0}
        $E --protocol fig-s4 --momentum $m --lrs ${FIG_S4_R18_LRS:-0.02,0.1} --model resnet18 --dataset cifar10 \
          --data $DATA --loader-threads 3 --epochs ${FIG_S4_R18_EPOCHS:-3} --replicas ${FIG_S4_R18_REPLICAS:-2} \
          --concurrent ${FIG_S4_R18_CONCURRENT:-4} --gpus ${GPUS:-1} --graph --tuning $R/resnet18-tuning.json --quiet --out $R/fig-s4-resnet18-m$m \
          > $R/fig-s4-resnet18-m$m.txt 2> $R/fig-s4-resnet18-m$m.err
        echo "rc=$?"; tail -14 $R/fig-s4-resnet18-m$m.txt
        grep -h '"test_top1"' $R/fig-s4-resnet18-m$m/*/manifest.json | sort | sed -n '1p;$p' ;;
      recipe-resnet18)
        # Optional, before exp-resnet18: the ResNet-18 recipe (docs/determinism.md) at three batch
        # sizes with the lr scaled as 0.1 per 128 (128/0.1, 256/0.2, 512/0.4), one replica each,
        # CONTROL seeds and the tuned deterministic kernels, side by side; pick the best for
        # R18_BATCH / R18_LR. EPOCHS as R18_EPOCHS (15). Wall: 3 x 15 epochs at about 6 s, 3 at a
        # time -> about 4-5 min.
        local b lr
        for b in 128 256 512; do
          lr=$(awk -v b=$b 'BEGIN { print 0.1 * b / 128 }')
          $B/examples/ditto-train --model resnet18 $cifar --epochs ${R18_EPOCHS:-15} --batch-size $b --lr $lr \
            --optimizer sgd --momentum 0.9 --nesterov --weight-decay 5e-4 --augment --lr-schedule onecycle \
            --warmup-epochs ${R18_WARMUP:-3} --deterministic-init --deterministic-input --kernels deterministic \
            --tuning $R/recipe-tuning-b$b.json --graph --quiet --out $R/recipe-b$b > $R/recipe-b$b.txt 2>&1 &
        done
        wait
        for b in 128 256 512; do echo "batch $b: $(tail -1 $R/recipe-b$b/log.csv)"; done ;;
      exp-resnet18)
        # The paper's main table, ResNet-18 on CIFAR-10 with the recipe of
        # docs/determinism.md (SGD momentum 0.9 Nesterov, wd 5e-4, pad-4 crop + flip, one-cycle
        # with a linear warm-up, R18_BATCH 256 at R18_LR 0.2, R18_EPOCHS 15, R18_WARMUP 3):
        # EXP_R18_SETTINGS (ALGO+IMPL,ALGO,IMPL,CONTROL; add IMPL-ATOMIC if the budget allows),
        # EXP_R18_REPLICAS (3), graphed, deterministic settings on a tuning file (one tuning epoch
        # first). The report has the decomposition, the least stable examples and the ensemble on
        # them. Wall: 12 replicas x 15 epochs at about 5.5-7 s (tuned deterministic ~5.7 s,
        # heuristic ~6.8 s at batch 128; evaluation included) -> about 17-20 min, 3 at a time
        # (ResNet-18 fills the GPU: concurrency mostly hides loader and evaluation gaps). Scale:
        # R18_EPOCHS=12 about 14-16 min; IMPL-ATOMIC adds about 5 min.
        # exp-resnet18:adam trains the same recipe with Adam (R18_ADAM_LR 1e-3 peak, the same weight
        # decay as L2, no momentum flags) into $R/exp-resnet18-adam: does the optimizer damp or
        # amplify the noise? GPUS (1) spreads the replicas over that many GPUs, EXP_R18_CONCURRENT
        # at a time on each (12 replicas on 4 GPUs, 3 each: about 5-6 min for 15 epochs).
        local settings=${EXP_R18_SETTINGS:-ALGO+IMPL,ALGO,IMPL,CONTROL} t0=$(date +%s)
        local optim="--optimizer sgd --momentum 0.9 --nesterov --lr ${R18_LR:-0.2}" dir=$R/exp-resnet18
        [ "$arg" = adam ] && optim="--optimizer adam --lr ${R18_ADAM_LR:-1e-3}" && dir=$R/exp-resnet18-adam
        $E --model resnet18 --dataset cifar10 --data $DATA --loader-threads 3 --epochs ${R18_EPOCHS:-15} \
          --batch-size ${R18_BATCH:-256} $optim \
          --weight-decay 5e-4 --augment --lr-schedule onecycle --warmup-epochs ${R18_WARMUP:-3} \
          --replicas ${EXP_R18_REPLICAS:-3} --settings $settings --concurrent ${EXP_R18_CONCURRENT:-3} \
          --gpus ${GPUS:-1} --graph --tuning $R/resnet18-tuning-b${R18_BATCH:-256}.json --quiet --out $dir \
          > $dir.txt 2> $dir.err
        echo "rc=$? wall $(( $(date +%s) - t0 ))s"; tail -30 $dir.txt ;;
      exp-optim)
        # Adam against SGD on SmallCNN CIFAR-10, the four settings each, 10 epochs, EXP_OPTIM_REPLICAS
        # (5) replicas, no augmentation: Adam 4e-4 (the paper's SmallCNN recipe) and SGD momentum 0.9
        # at lr 0.01 (figure S4's largest rate at momentum 0.9), into $R/exp-optim/{adam,sgd}; then
        # bench/settings_compare.py puts them side by side. Wall: about 1 min each (graphed, concurrent).
        local o dir=$R/exp-optim
        mkdir -p $dir
        for o in adam sgd; do
          local flags="--optimizer adam --lr 4e-4"
          [ $o = sgd ] && flags="--optimizer sgd --momentum 0.9 --lr 0.01"
          $E --model smallcnn --dataset cifar10 --data $DATA --loader-threads 2 --epochs 10 $flags \
            --replicas ${EXP_OPTIM_REPLICAS:-5} --settings ALGO+IMPL,ALGO,IMPL,CONTROL --concurrent 20 --gpus ${GPUS:-1} \
            --graph --quiet --resume --out $dir/$o > $dir/$o.txt 2> $dir/$o.err
          echo "$o rc=$?"; tail -8 $dir/$o.txt
        done
        python3 bench/settings_compare.py --run Adam=$dir/adam/report.csv --run SGD=$dir/sgd/report.csv \
          --column optimizer --out $dir/compare.md && cat $dir/compare.md ;;
      overhead)
        local m
        for m in smallcnn resnet18; do
          $E --protocol overhead --model $m --dataset cifar10 --data $DATA --loader-threads 6 --lr 4e-4 --optimizer adam \
            --epochs 1 --quiet --out $R/overhead-$m > $R/overhead-$m.txt 2> $R/overhead-$m.err; echo "$m rc=$?"
          tail -9 $R/overhead-$m.txt
        done ;;
      mnist)
        # Keras's mnist_cnn under CONTROL: bit-identical across replicas (dropout from Philox).
        [ -d /tmp/mnist ] || { mkdir -p /tmp/mnist && cp .data/mnist/*.gz /tmp/mnist/; }
        $E --model mnist-cnn --dataset mnist --data /tmp/mnist --loader-threads 2 --epochs 3 --lr 1e-3 --optimizer adam \
          --replicas 3 --settings CONTROL,IMPL --concurrent 6 --quiet --out $R/mnist > $R/mnist.txt 2> $R/mnist.err
        echo "rc=$?"; tail -6 $R/mnist.txt ;;
      celeba)
        # The paper's figure 4: Blond_Hair, subgroups by Male; FPR / FNR spread per subgroup.
        rm -rf $R/celeba  # ResNet-18 at 64x64: 15 at a time, or 5 graphed, did not fit in 80 GB
        [ -d /tmp/celeba/celeba64 ] || { mkdir -p /tmp/celeba && tar xzf .data-celeba/celeba64.tar.gz -C /tmp/celeba; }
        $E --model resnet18 --dataset celeba --data /tmp/celeba/celeba64 --loader-threads 2 --epochs 3 --lr 4e-4 \
          --optimizer adam --replicas 5 --settings ALGO+IMPL,IMPL,CONTROL --concurrent 5 --quiet \
          --out $R/celeba > $R/celeba.txt 2> $R/celeba.err; echo "rc=$?"; tail -8 $R/celeba.txt ;;
      tasks)
        # The networks of the other task kinds on their real data — unet-small on mnist-seg
        # (pixel-wise loss, bilinear and nearest upsampling), stn on mnist-rt (affine grid, grid
        # sampling), ctc-cnn on mnist-strings (CTC loss, the time-major gather), embedding-bag on
        # celeba-attrs (Blond_Hair from the other 39 attributes; embedding-bag scatter). Per model:
        # (1) the paper's four settings, TASK_REPLICAS (3) replicas x TASK_EPOCHS (2) epochs on the
        # first TASK_TRAIN (20000) training and TASK_TEST (2000) test examples, report in
        # $R/tasks/<model>/exp; (2) the add-one attribution over the task ops' knobs and the grouped
        # classic ones (all conv2d.bwd_filter=algo0, ...), 2 replicas x TASK_STEPS (200) steps,
        # in $R/tasks/<model>/attr/add-one. CTC_PIN (e.g. "--pin loss.algo=ditto") keeps cuDNN's CTC
        # out of the heuristic settings if it fails on this host. Wall (estimate; small nets are
        # launch-bound, 4 replicas at a time): about 1-2 min per model, 5-8 min for all four.
        [ -d /tmp/mnist ] || { mkdir -p /tmp/mnist && cp .data/mnist/*.gz /tmp/mnist/; }
        [ -f /tmp/celeba/celeba64/list_attr_celeba.txt ] || { mkdir -p /tmp/celeba && tar xzf .data-celeba/celeba64.tar.gz \
          -C /tmp/celeba celeba64/list_attr_celeba.txt celeba64/list_eval_partition.txt; }
        local spec m ds dir lr only extra t0
        for spec in "unet-small mnist-seg /tmp/mnist 3e-3 up1.,up2.,loss.,all" \
                    "stn mnist-rt /tmp/mnist 1e-3 affine_grid.,grid_sample.,loss.,all" \
                    "ctc-cnn mnist-strings /tmp/mnist 1e-3 time_major.,loss.,loss_mean.,all" \
                    "embedding-bag celeba-attrs /tmp/celeba/celeba64 1e-2 -"; do
          set -- $spec; m=$1 ds=$2 dir=$3 lr=$4 only=$5
          [ -n "$arg" ] && [[ ",$arg," != *",$m,"* ]] && continue
          # "all" stands for the grouped candidates ("all conv2d.bwd_filter=algo0", ...)
          local pick=(); [ "$only" != - ] && pick=(--only "${only//all/all }")
          extra=""; [ $m = ctc-cnn ] && extra=${CTC_PIN:-}
          local base="--model $m --dataset $ds --data $dir --loader-threads 2 --batch-size 128 --lr $lr --optimizer adam \
            --train-size ${TASK_TRAIN:-20000} --test-size ${TASK_TEST:-2000} --quiet $extra"
          t0=$(date +%s)
          $E $base --epochs ${TASK_EPOCHS:-2} --replicas ${TASK_REPLICAS:-3} --settings ALGO+IMPL,ALGO,IMPL,CONTROL \
            --concurrent 4 --resume --out $R/tasks/$m/exp > $R/tasks-$m-exp.txt 2> $R/tasks-$m-exp.err
          echo "$m experiment rc=$? wall $(( $(date +%s) - t0 ))s"; sed -n '/^setting/,/^$/p' $R/tasks-$m-exp.txt
          t0=$(date +%s)
          $A $base --steps ${TASK_STEPS:-200} --replicas 2 --form add-one ${pick[@]+"${pick[@]}"} --l2-steps 1,10,${TASK_STEPS:-200} \
            --fingerprint-steps ${TASK_STEPS:-200} --concurrent 2 --no-checkpoint --overwrite --out $R/tasks/$m/attr \
            > $R/tasks-$m-attr.txt 2> $R/tasks-$m-attr.err
          echo "$m attribution rc=$? wall $(( $(date +%s) - t0 ))s"; sed -n '/^rank/,/^$/p' $R/tasks-$m-attr.txt | head -16
        done ;;
      task-ops)
        # The task networks' ops (scatter and reduction families; sampling, CTC and sparse rows):
        # ditto's variants (distinct results out of 20 calls, us per call) and PyTorch's paths in
        # its default and deterministic modes, at the same sizes; one table.
        $B/bench/op_noise --families scatter,upsample,pixel_xent,reduce --group all --runs 20 --out $R/task_ops \
          > /dev/null 2> $R/task_ops.err; echo "op_noise rc=$?"
        rm -f $R/torch_scatter_reduce.jsonl $R/torch_sampler_ctc_spmm.jsonl
        timeout 240 python3 bench/peers/torch_scatter_reduce.py --out $R/torch_scatter_reduce.jsonl > /dev/null \
          2> $R/torch_scatter_reduce.err
        echo "torch_scatter_reduce rc=$?"
        timeout 240 python3 bench/peers/torch_sampler_ctc_spmm.py --out $R/torch_sampler_ctc_spmm.jsonl > /dev/null \
          2> $R/torch_sampler_ctc_spmm.err
        echo "torch_sampler_ctc_spmm rc=$?"
        # (The sampling, CTC and sparse rows first: the order the committed tables have.)
        python3 bench/task_ops_table.py $R/task_ops/op_noise.csv $R/torch_sampler_ctc_spmm.jsonl \
          $R/torch_scatter_reduce.jsonl --out $R/task_ops.md; grep -c "differs" $R/task_ops.md ;;
      scatter-torch-recheck)
        # The sorted scatters and ditto.torch's host path after a change to either: their GPU tests, op_noise's
        # scatter rows (distinct of 20, µs), and ditto.torch's scatter / index / pixel-loss rows timed call by
        # call (bench/torch_ops.py --profile) and back to back (bench/torch_host_split.py). Needs the carried
        # wheels (.whl) for the Python package. Wall: about 3 min (estimate).
        local P=$R/scatter-torch-recheck; rm -rf $P; mkdir -p $P
        (cd $B && ctest -R "gpu_scatter|gpu_python" --output-on-failure --timeout 400 > $P/tests.txt 2>&1)
        grep -E "tests passed|tests failed|Failed|\*\*\*" $P/tests.txt
        $B/bench/op_noise --group classic --families scatter --runs 20 --out $P/op_noise > $P/op_noise.txt 2>&1
        echo "op_noise rc=$?"; grep -E "embedding|scatter_add" $P/op_noise.txt
        timeout 240 python3 bench/torch_ops.py --only scatter_add,index_add,nll_loss-2d,cross_entropy-2d,embedding_bag-mean \
          --repeats 20 --profile --out $P/torch_ops > $P/torch_ops.log 2>&1; echo "torch_ops rc=$?"
        timeout 120 python3 bench/torch_host_split.py --calls 200 --out $P/host_split.jsonl > $P/host_split.md \
          2> $P/host_split.err; echo "torch_host_split rc=$?"; cat $P/host_split.md ;;
      dp1)
        # Data parallelism with the one GPU lent: ResNet-18 on CIFAR-10, DP_STEPS (300) deterministic steps,
        # the plain trainer, then --gpus 1 --dp-groups 1 (the data-parallel path: one rank, one example
        # group, one bucket; without --dp-groups one GPU is the plain trainer) under each
        # all-reduce. The design says every one of them ends with the plain trainer's weights.
        local T=$B/examples/ditto-train a t0
        local base="--model resnet18 $cifar --steps ${DP_STEPS:-300} --batch-size 128 --lr 0.1 --kernels deterministic \
          --seed-init 1 --seed-order 2 --seed-augment 3 --overwrite --quiet"
        for a in plain fixed-order ring nccl-default nccl-ring-simple nccl-tree-ll; do
          local extra=""; [ $a != plain ] && extra="--gpus 1 --dp-groups 1 --bucket-mb 1024 --pin bucket0.algo=$a"
          t0=$(date +%s%N)
          $T $base $extra --out $R/dp1/$a > $R/dp1-$a.txt 2> $R/dp1-$a.err
          echo "dp1 $a rc=$? $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(grep -o 'weights fingerprint [0-9a-f]*' $R/dp1-$a.txt)"
        done ;;
      ddp)
        # Data parallelism on a machine of several GPUs (runs on one too, with K = 1 only). ResNet-18 on
        # CIFAR-10, DP_STEPS (300) steps at global batch 128, 4 example groups, 25 MB buckets (two
        # for ResNet-18), fixed seeds. For K = 1, 2, 4 visible GPUs: ditto-train --gpus K under
        # fixed-order and under nccl-default, twice each. The design says: every fixed-order run
        # ends with one fingerprint whatever K; nccl-default may differ between K (and, where NCCL
        # picks differently, between repeats). Seconds from each run's log.csv (the 300 steps and
        # one evaluation). Then PyTorch DDP on the same counts, twice each (bench/peers/torch_ddp.py).
        local T=$B/examples/ditto-train n k a rep counts=""
        n=$(nvidia-smi -L | wc -l)
        local base="--model resnet18 $cifar --steps ${DP_STEPS:-300} --batch-size 128 --lr 0.1 --kernels deterministic \
          --seed-init 1 --seed-order 2 --seed-augment 3 --dp-groups 4 --bucket-mb 25 --overwrite --quiet"
        for k in 1 2 4; do
          [ $k -le $n ] || continue
          counts="$counts${counts:+,}$k"
          for a in fixed-order nccl-default; do
            for rep in 1 2; do
              $T $base --gpus $k --pin "*.algo=$a" --out $R/ddp/$a-$k-$rep > $R/ddp-$a-$k-$rep.txt 2> $R/ddp-$a-$k-$rep.err
              echo "ddp ditto $a gpus=$k run=$rep rc=$? $(grep -o 'weights fingerprint [0-9a-f]*' $R/ddp-$a-$k-$rep.txt)" \
                "seconds $(tail -1 $R/ddp/$a-$k-$rep/log.csv 2>/dev/null | awk -F, '{print $NF}')"
            done
          done
        done
        rm -f $R/torch_ddp.jsonl
        timeout 400 python3 bench/peers/torch_ddp.py --gpus $counts --repeat 2 --steps 100 --out $R/torch_ddp.jsonl \
          > /dev/null 2> $R/torch_ddp.err
        echo "torch_ddp rc=$?"; python3 -c "import json,sys
for l in open('$R/torch_ddp.jsonl'):
    r = json.loads(l); print(r['mode'], 'gpus', r['gpus'], 'run', r['run'], r.get('error') or
          '%.1f ms, %.0f img/s, %.0f per GPU, weights %s' % (r['ms_median'], r['images_per_s'], r['images_per_s_per_gpu'], r['weights_sha1'][:12]))" ;;
      opnoise)
        # A before/after table of a kernel change: op_noise at three shapes (ResNet-18's stem, middle and last
        # stage). OPNOISE_BIN picks another build's binary (the "before" commit, same call).
        # opnoise:before builds op_noise from .carry/before.tar.gz (git archive of the commit
        # before the change) and measures it in the same call.
        local sh bin=${OPNOISE_BIN:-$B/bench/op_noise} tag=${OPNOISE_TAG:-after}
        if [ "$arg" = before ]; then
          tag=before; bin=/tmp/before-src/build-gpu/bench/op_noise
          if [ ! -x $bin ]; then
            rm -rf /tmp/before-src && mkdir -p /tmp/before-src && tar xzf .carry/before.tar.gz -C /tmp/before-src
            ln -s $PWD/.deps /tmp/before-src/.deps
            (cd /tmp/before-src && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=$PWD/.deps \
               -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null && cmake --build build-gpu -j "$(nproc)" --target op_noise > $R/before-build.log 2>&1)
            echo "before build rc=$? ($(tar xzOf .carry/before.tar.gz ./COMMIT 2>/dev/null || echo '?'))"
          fi
        fi
        for sh in "128 3 32 64 3 3x32" "128 128 16 128 3 128x16" "128 512 4 512 3 512x4"; do
          set -- $sh
          $bin --n $1 --c $2 --hw $3 --k $4 --r $5 --runs 20 --out $R/op_noise-$tag/$6 > /dev/null 2> $R/op_noise-$tag-$6.err
          echo "op_noise $tag $6 rc=$?"
        done ;;
      opnoise-amp)
        # op_noise's conv rows in every precision and layout and its linear rows (cuBLAS, cuBLAS
        # with atomics, cuBLASLt) in every precision, at ResNet-18's middle stage (128x128x16x16,
        # 3x3), 20 calls each, into $R/op_noise-amp.
        $B/bench/op_noise --n 128 --c 128 --hw 16 --k 128 --r 3 --runs 20 --families conv,linear \
          --precisions ${OPNOISE_PRECISIONS:-fp32,tf32,bf16,fp16} --layouts nchw,nhwc --out $R/op_noise-amp \
          > $R/op_noise-amp.txt 2> $R/op_noise-amp.err
        echo "op_noise amp rc=$?"; tail -2 $R/op_noise-amp.err ;;
      racecheck-ditto)
        # racecheck over ditto's own kernels only (names contain "ditto"): cuDNN's and cuBLAS's
        # kernels are not ours to fix and instrumenting them is what made the full run take hours.
        local cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer) t
        for t in $B/tests/gpu_*; do
          timeout ${arg:-480} $cs --tool racecheck --kernel-name kns=ditto --error-exitcode 1 $t > $R/racecheck-ditto-$(basename $t).log 2>&1 &
        done
        wait
        for t in $B/tests/gpu_*; do
          local l=$R/racecheck-ditto-$(basename $t).log
          echo "$(basename $t): $(grep -h 'ERROR SUMMARY' $l | tail -1) $(grep -hE 'tests? passed|failed' $l | tail -1)"
        done ;;
      racecheck-cases)
        # The binaries racecheck-ditto did not finish in its limit, one process per test case, all
        # at once (the sanitizer's cost is host-side; the host has 16 cores): RACECHECK_BINS.
        local cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer) t name i
        for t in ${RACECHECK_BINS:-gpu_graph gpu_mnist gpu_noise_lab gpu_pool}; do
          i=0
          while IFS= read -r name; do
            i=$((i + 1)); name=$(printf '%s' "$name" | sed 's/[],[\\*]/\\&/g')  # Catch2 spec escapes
            timeout ${arg:-540} $cs --tool racecheck --kernel-name kns=ditto --error-exitcode 1 $B/tests/$t "$name" \
              > $R/racecheck-case-$t-$i.log 2>&1 &
          done < <($B/tests/$t --list-test-names-only | grep -v '^$')
        done
        wait
        for l in $R/racecheck-case-*.log; do
          echo "$(basename $l .log): $(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' $l | tail -1) $(grep -hE 'tests? passed|failed' $l | tail -1)"
        done ;;
      memcheck|racecheck)
        # compute-sanitizer over every GPU test binary, all at once (one GPU, many
        # cores; each under its own time limit: the sanitizer slows cuDNN calls by orders).
        local cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer) t
        for t in $B/tests/gpu_*; do
          timeout ${arg:-480} $cs --tool $step --error-exitcode 1 $t > $R/$step-$(basename $t).log 2>&1 &
        done
        wait
        for t in $B/tests/gpu_*; do
          local l=$R/$step-$(basename $t).log
          echo "$(basename $t): $(grep -h 'ERROR SUMMARY' $l | tail -1) $(grep -hE 'tests? passed|failed' $l | tail -1)"
        done ;;
      free-det)
        # Every row measured against a goal of free determinism, in one session on one GPU: the zoo's
        # deterministic-tuned step beside PyTorch's default (DenseNet time; VGG with a 4 GiB tuning
        # budget and EfficientNet-B0 peak memory), SmallCNN and ResNet-18 graphed (bench/step_time and
        # its peer), and op_noise's deterministic scatter, ROI-align and SpMM rows against their
        # atomic ones. bench/free_det_table.py renders the rows; about 5 minutes.
        local F=$R/free-det P=${PYTHON:-/opt/torch/.venv/bin/python3}; rm -rf $F; mkdir -p $F
        timeout 300 $B/bench/overhead --models densenet169,densenet201,efficientnet-b0 --modes deterministic-tuned \
          --warmup 3 --steps 20 --profile-steps 0 --tuning-dir $F/tuning --out $F/overhead.jsonl > /dev/null 2> $F/overhead.err
        echo "overhead rc=$?"
        timeout 200 $B/bench/overhead --models vgg16,vgg19 --modes deterministic-tuned --tuning-workspace-mb 4096 \
          --warmup 3 --steps 20 --profile-steps 0 --tuning-dir $F/tuning-4g --out $F/overhead.jsonl > /dev/null 2>> $F/overhead.err
        echo "overhead vgg rc=$?"
        timeout 300 $P bench/peers/torch_overhead.py --models densenet169,densenet201,efficientnet-b0,vgg16,vgg19 \
          --modes default --warmup 3 --steps 20 --out $F/torch_overhead.jsonl > /dev/null 2> $F/torch_overhead.err
        echo "torch_overhead rc=$?"
        $B/bench/step_time --models smallcnn,resnet18 --modes deterministic-tuned --graph graph --precisions fp32 \
          --warmup 20 --steps 200 --tuning-dir $F/tuning --out $F/step_time.jsonl > /dev/null 2> $F/step_time.err
        echo "step_time rc=$?"; grep -E "^BITS" $F/step_time.err
        $P bench/peers/torch_step_time.py --models smallcnn,resnet18 --modes default --precisions fp32 --warmup 20 \
          --steps 200 --out $F/torch_step_time.jsonl > /dev/null 2> $F/torch_step_time.err
        echo "torch_step_time rc=$?"
        $B/bench/op_noise --group all --families scatter --runs 20 --out $F/op_noise > $F/op_noise.txt 2>&1
        echo "op_noise rc=$?"
        python3 bench/free_det_table.py --overhead $F/overhead.jsonl --torch-overhead $F/torch_overhead.jsonl \
          --step-time $F/step_time.jsonl --torch-step-time $F/torch_step_time.jsonl --op-noise $F/op_noise/op_noise.csv \
          --out $F/free_det.md --json $F/free_det.json ;;
      free-det-ncu)
        # Per-kernel profiles of the rows free-det found short of their goal (Nsight Compute, each kernel
        # alone at the GPU's own clocks): ResNet-18's graphed step, ditto deterministic-tuned and PyTorch's
        # default (bench/ncu_step_table.py), and op_noise's scatter, ROI-align and SpMM calls, 3 each.
        local F=$R/free-det P=${PYTHON:-/opt/torch/.venv/bin/python3}; mkdir -p $F
        local ncu="ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base"
        $ncu $B/bench/step_time --models resnet18 --modes deterministic-tuned --graph graph --warmup 2 --steps 3 \
          --tuning-dir $F/tuning > $F/ncu-resnet18-ditto.csv 2> $F/ncu.err; echo "ncu resnet18 ditto rc=$?"
        $ncu $P bench/peers/torch_step_time.py --models resnet18 --modes default --warmup 2 --steps 3 \
          > $F/ncu-resnet18-torch.csv 2>> $F/ncu.err; echo "ncu resnet18 torch rc=$?"
        python3 bench/ncu_step_table.py $F/ncu-resnet18-*.csv --json $F/ncu_resnet18.json > $F/ncu_resnet18.md
        head -4 $F/ncu_resnet18.md
        $ncu $B/bench/op_noise --group all --families scatter --runs 3 --out $F/op_noise-ncu > $F/ncu-op_noise.csv \
          2>> $F/ncu.err; echo "ncu op_noise rc=$?"
        python3 bench/ncu_step_table.py --blocks $F/ncu-op_noise.csv > $F/ncu_op_noise_blocks.md
        gzip -f $F/ncu-*.csv ;;
      zoo-overhead)
        # The paper's figure 6: ms/step, peak memory and per-op-kind breakdown per zoo
        # model and kernel mode (batch 128, 224x224 / 299x299, 1000 classes), PyTorch's peer, the
        # table and chart. About 9 minutes at most: each program stops starting configurations
        # after its budget and is killed at its timeout; the whole zoo takes about two calls:
        # --resume skips what the files hold already (measured or out of memory), so calling
        # the step again completes them (tuning files are kept in $R/overhead-tuning). MODELS
        # (comma list) picks some. rm $R/*overhead.jsonl to start over.
        # OVERHEAD_STEPS timed steps (default 100, as the paper profiled; the 2026-11-23
        # zoo table timed 10): about 10x the timing of the 10-step run, so the zoo takes several
        # calls of this step. Files other than at 100 steps get a -<N>steps suffix;
        # bench/overhead_steps.py compares the two.
        local pick=${arg:+--models $arg} steps=${OVERHEAD_STEPS:-100} sfx=""
        [ "$steps" != 100 ] && sfx="-${steps}steps"
        timeout 390 $B/bench/overhead $pick --resume --warmup 3 --steps $steps --profile-steps 2 --budget-s 300 \
          --tuning-dir $R/overhead-tuning --out $R/overhead$sfx.jsonl > /dev/null 2> $R/overhead.err
        echo "overhead rc=$? ($(grep -c . $R/overhead$sfx.jsonl) lines, $(grep -c '"error"' $R/overhead$sfx.jsonl) failed or skipped)"
        timeout 150 python3 bench/peers/torch_overhead.py $pick --resume --warmup 3 --steps $steps --budget-s 120 \
          --out $R/torch_overhead$sfx.jsonl > /dev/null 2> $R/torch_overhead.err
        echo "torch_overhead rc=$?"; tail -n 2 $R/torch_overhead.err
        python3 bench/overhead_table.py $R/overhead$sfx.jsonl $R/torch_overhead$sfx.jsonl --out $R/overhead$sfx.md \
          --svg $R/overhead$sfx.svg 2> $R/overhead_table.err
        echo "overhead_table rc=$?"; sed -n '/^| model | heuristic/,/^$/p' $R/overhead$sfx.md
        if ls $R/overhead-*steps.jsonl > /dev/null 2>&1 && [ -f $R/overhead.jsonl ]; then
          python3 bench/overhead_steps.py $R/overhead*.jsonl $R/torch_overhead*.jsonl --out $R/overhead_steps.md | tail -3
        fi ;;
      precision)
        # ditto's modes heuristic, deterministic and fastest under *.precision=fp32|bf16|fp16 against
        # PyTorch's default, benchmark and deterministic modes in fp32 and AMP (autocast, channels-last,
        # GradScaler for fp16), as step times and peak memory. (1) CIFAR shapes, bench/step_time and
        # torch_step_time.py: resnet18 and smallcnn, batch 128, eager and graphed, PRECISION_STEPS (50)
        # timed steps after 10; (2) zoo models, bench/overhead and torch_overhead.py: PRECISION_ZOO
        # (resnet50,mobilenet-v2,efficientnet-b0) at PRECISION_ZOO_BATCH (64), 224x224, eager, 10 timed
        # steps after 3. Then both tables (their "Precisions" sections: det / fastest, det / PyTorch
        # default, peak memory ditto / PyTorch). Files under $R/precision; (1) starts over each time,
        # (2) --resumes (rm $R/precision/*overhead.jsonl to start over). Wall (estimate from the
        # steptime and zoo-overhead steps): (1) 36 + 36 configurations, about 1.5 min; (2) 27 + 27, about
        # 2.5 min; each program is cut by its budget or timeout (90, 70, 110, 85 s): at most 6 min in all.
        # PRECISION_NATIVE=1: ditto's bf16/fp16 rows hand bf16/f16 channels-last activations between layers
        # (--native-activations), as the autocast peers do.
        local P=$R/precision steps=${PRECISION_STEPS:-50} zoo=${PRECISION_ZOO:-resnet50,mobilenet-v2,efficientnet-b0}
        local native=${PRECISION_NATIVE:+--native-activations}
        mkdir -p $P; rm -f $P/step_time.jsonl $P/torch_step_time.jsonl
        timeout 90 $B/bench/step_time --models resnet18,smallcnn --modes heuristic,deterministic,fastest --channels-last $native \
          --precisions fp32,bf16,fp16 --warmup 10 --steps $steps --out $P/step_time.jsonl --tuning-dir $P/tuning \
          > /dev/null 2> $P/step_time.err
        echo "step_time rc=$? ($(grep -c . $P/step_time.jsonl) lines)"; grep -E "^BITS" $P/step_time.err
        timeout 70 python3 bench/peers/torch_step_time.py --models resnet18,smallcnn --modes default,benchmark,deterministic \
          --precisions fp32,bf16,fp16 --warmup 10 --steps $steps --out $P/torch_step_time.jsonl > /dev/null \
          2> $P/torch_step_time.err
        echo "torch_step_time rc=$? ($(grep -c . $P/torch_step_time.jsonl) lines)"; tail -n 1 $P/torch_step_time.err
        timeout 110 $B/bench/overhead --models $zoo --modes heuristic,fastest,deterministic --precisions fp32,bf16,fp16 --channels-last $native \
          --batch ${PRECISION_ZOO_BATCH:-64} --warmup 3 --steps 10 --profile-steps 0 --budget-s 85 --resume \
          --tuning-dir $P/overhead-tuning --out $P/overhead.jsonl > /dev/null 2> $P/overhead.err
        echo "overhead rc=$? ($(grep -c . $P/overhead.jsonl) lines, $(grep -c '"error"' $P/overhead.jsonl) failed or skipped)"
        timeout 85 python3 bench/peers/torch_overhead.py --models $zoo --modes default,benchmark,deterministic \
          --precisions fp32,bf16,fp16 --batch ${PRECISION_ZOO_BATCH:-64} --warmup 3 --steps 10 --budget-s 60 --resume \
          --out $P/torch_overhead.jsonl > /dev/null 2> $P/torch_overhead.err
        echo "torch_overhead rc=$?"; tail -n 1 $P/torch_overhead.err
        python3 bench/step_time_table.py $P/step_time.jsonl $P/torch_step_time.jsonl --out $P/step_time.md \
          --csv $P/step_time.csv 2> $P/step_time_table.err
        echo "step_time_table rc=$?"; sed -n '/^## Precisions/,/^## Roofline/p' $P/step_time.md
        python3 bench/overhead_table.py $P/overhead.jsonl $P/torch_overhead.jsonl --out $P/overhead.md \
          2> $P/overhead_table.err
        echo "overhead_table rc=$?"; sed -n '/^## Precisions/,/^## Which op/p' $P/overhead.md ;;
      precision-zoo)
        # The whole zoo in bf16 and fp16 against PyTorch's AMP (autocast, channels-last, GradScaler for
        # fp16): bench/overhead modes ZOO_MODES (fastest,deterministic) with --channels-last --native-activations,
        # torch_overhead.py modes ZOO_TORCH_MODES (default,deterministic); batch PRECISION_ZOO_BATCH (64), 224 px
        # (Inception-v3 299), ZOO_STEPS (10) timed steps after 3, one profiled step (the per-op breakdown that explains
        # a miss). ARG: comma list of models (default the 17 of the zoo). The models are dealt over the GPUs
        # of ZOO_GPUS (comma list of indices, default every GPU), most expensive first, one process pair per
        # GPU, so each configuration has its GPU to itself. Files $R/precision-zoo/{overhead,torch_overhead}-gN.jsonl
        # (--resume: calling the step again completes what a timeout cut), overhead.md over all of them.
        # Wall: about 6 min on four GPUs (estimate; each shard is cut at 330 s + 200 s).
        local P=$R/precision-zoo batch=${PRECISION_ZOO_BATCH:-64} g i=0
        local order="densenet201 resnet152 vgg19 inception-v3 xception vgg16 densenet169 resnet101 densenet121 resnet50 efficientnet-b0 mobilenet-v2 mobilenet mediumcnn-k7 mediumcnn-k5 mediumcnn-k3 mediumcnn-k1"
        local -a gpus shard
        IFS=, read -r -a gpus <<< "${ZOO_GPUS:-$(seq -s, 0 $(( $(nvidia-smi -L | wc -l) - 1 )))}"
        local models=${arg:-${order// /,}}
        mkdir -p $P
        for m in $order; do
          [[ ",$models," == *",$m,"* ]] || continue
          shard[i % ${#gpus[@]}]+="${shard[i % ${#gpus[@]}]:+,}$m"; i=$((i + 1))
        done
        for i in "${!gpus[@]}"; do
          [ -n "${shard[i]:-}" ] || continue
          g=${gpus[i]}
          ( export CUDA_VISIBLE_DEVICES=$g
            timeout 330 $B/bench/overhead --models ${shard[i]} --modes ${ZOO_MODES:-fastest,deterministic} --precisions bf16,fp16 \
              --channels-last --native-activations --batch $batch --warmup 3 --steps ${ZOO_STEPS:-10} --profile-steps 1 --budget-s 280 \
              --resume --tuning-dir $P/tuning-g$g --out $P/overhead-g$g.jsonl > /dev/null 2> $P/overhead-g$g.err
            echo "gpu $g ditto ${shard[i]} rc=$?"
            timeout 200 python3 bench/peers/torch_overhead.py --models ${shard[i]} --modes ${ZOO_TORCH_MODES:-default,deterministic} \
              --precisions bf16,fp16 --batch $batch --warmup 3 --steps ${ZOO_STEPS:-10} --budget-s 160 --resume \
              --out $P/torch_overhead-g$g.jsonl > /dev/null 2> $P/torch_overhead-g$g.err
            echo "gpu $g pytorch rc=$?" ) &
        done
        wait
        python3 bench/overhead_table.py $P/overhead-g*.jsonl $P/torch_overhead-g*.jsonl --out $P/overhead.md \
          2> $P/overhead_table.err
        echo "overhead_table rc=$?"; sed -n '/^## Precisions/,/^## Which op/p' $P/overhead.md ;;
      where)
        echo "git: $(git rev-parse --short=12 HEAD 2>&1 | head -1); .ditto-commit: $(cat .ditto-commit)"; ls -a | head -30 ;;
    esac
  done
  echo "=== done $(date -u +%T)"
}

case $cmd in
  start)
    export TOP OPNOISE_BIN OPNOISE_TAG RACECHECK_BINS FIG_S4_LRS FIG_S4_EPOCHS FIG_S4_REPLICAS FIG_S4_R18_LRS \
      FIG_S4_R18_EPOCHS FIG_S4_R18_REPLICAS FIG_S4_R18_CONCURRENT GPUS R18_ADAM_LR EXP_OPTIM_REPLICAS R18_BATCH R18_LR R18_EPOCHS R18_WARMUP EXP_R18_SETTINGS EXP_R18_REPLICAS \
      EXP_R18_CONCURRENT OVERHEAD_STEPS TASK_TRAIN TASK_TEST TASK_EPOCHS TASK_REPLICAS TASK_STEPS CTC_PIN DP_STEPS \
      STEPTIME_PRECISIONS PRECISION_STEPS PRECISION_ZOO PRECISION_ZOO_BATCH ZOO_GPUS ZOO_MODES ZOO_TORCH_MODES ZOO_STEPS PRECISION_NATIVE GRAD_NATIVE EXP_PRECISIONS EXP_PREC_NATIVE EXP_PREC_EPOCHS EXP_PREC_REPLICAS \
      EXP_PREC_CONCURRENT ATTR_PREC_REPLICAS ATTR_PREC_STEPS GRAD_MODELS DIVERGE_ZOO_STEPS COMPARE_WITH
    mkdir -p $R
    if [ ! -d $DATA/train ] && [ -f .data/cifar10-jpeg.tar.gz ]; then mkdir -p $DATA && tar xzf .data/cifar10-jpeg.tar.gz -C $DATA; fi
    scripts/gpu-build.sh > $R/build.log 2>&1 || { tail -30 $R/build.log; exit 1; }
    export LD_LIBRARY_PATH=$PWD/.deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
    setsid nohup bash "$0" run "$@" > $LOG 2>&1 < /dev/null &
    sleep 2; cat $LOG ;;
  run) pipeline "$@" ;;
  wait)
    limit=${1:-500}; t0=$(date +%s)
    while ! grep -q "^=== done" $LOG 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 10; done
    cat $LOG; for e in $R/*.err; do [ -f "$e" ] && { echo "-- $e"; tail -1 "$e"; }; done ;;
  collect)
    OUT=${OUT:-$PWD/gpurun-out}; mkdir -p "$OUT"
    cp $LOG "$OUT/"
    tar czf "$OUT/gpurun.tar.gz" -C /tmp --exclude='*.safetensors' --exclude='predictions.csv' gpurun
    ls -la "$OUT" ;;
  *) echo "usage: $0 start STEP... | wait SECONDS | collect"; exit 2 ;;
esac
