#!/usr/bin/env bash
# Data-parallel ranks as processes on the CPU, with the environment Slurm gives each task set by
# hand (SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_ID, SLURM_STEP_ID): 2 and 4 ditto-train processes
# under --dp-launch slurm end with the bits of the same ranks as threads (--gpus K) and of one
# rank running K example groups; a resumed run continues them; a rank that never comes, a
# mismatched rank and a finished run folder are errors that say so, and leave nothing behind; batch
# norm, local and synchronized, gives the threads' bits too.
# (tests/slurm_study.sh launches the same through a real srun.)
#   dp_processes.sh DITTO_TRAIN WORK_DIR
set -euo pipefail
TRAIN=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
cd "$W"
common=(--device cpu --model two-conv --synthetic-train 96 --synthetic-test 48 --synthetic-size 16 --batch-size 32
        --loader-threads 0 --deterministic-init --deterministic-input --kernels deterministic --quiet)
fingerprint() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"]["weights_fingerprint"])' "$1/manifest.json"; }
fail() { echo "dp_processes: $*" >&2; exit 1; }

# K processes of one job step (job id $2), each with the flags after the first two arguments;
# their outputs in $3-rank<r>.txt, their exit codes in rc-$3-<r>.
launch() {
  local k=$1 job=$2 tag=$3; shift 3
  local r
  for (( r = 0; r < k; r++ )); do
    ( set +e; SLURM_NTASKS=$k SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_JOB_ID=$job SLURM_STEP_ID=0 \
        "$TRAIN" "${common[@]}" "$@" > "$tag-rank$r.txt" 2>&1; echo $? > "rc-$tag-$r" ) &
  done
  wait
}

for k in 2 4; do
  "$TRAIN" "${common[@]}" --epochs 2 --gpus $k --out threads$k > /dev/null
  "$TRAIN" "${common[@]}" --epochs 2 --dp-groups $k --out one$k > /dev/null
  launch $k $(( 100 + k )) procs$k --epochs 2 --dp-launch slurm --out procs$k
  for (( r = 0; r < k; r++ )); do
    [ "$(cat rc-procs$k-$r)" = 0 ] || { cat procs$k-rank$r.txt >&2; fail "rank $r of $k exited $(cat rc-procs$k-$r)"; }
  done
  grep -q "^rank 1: trained 6 steps" procs$k-rank1.txt || fail "rank 1 did not report its steps: $(cat procs$k-rank1.txt)"
  a=$(fingerprint threads$k); b=$(fingerprint one$k); c=$(fingerprint procs$k)
  echo "$k ranks: threads $a, one rank with $k groups $b, $k processes $c"
  [ "$a" = "$c" ] && [ "$b" = "$c" ] || fail "$k processes end with other weights than $k threads or one rank"
  [ ! -e procs$k/.rendezvous ] || fail "the rendezvous folder of procs$k was left behind"
  python3 - procs$k/manifest.json $k <<'PY'
import json, socket, sys
m = json.load(open(sys.argv[1]))
k = int(sys.argv[2])
d = m["data_parallel"]
assert d["processes"]["world"] == k and len(d["devices"]) == k and d["ranks"] == k, d
assert d["hosts"] == [socket.gethostname()] * k and d["devices"] == ["cpu"] * k, (d["hosts"], d["devices"])
assert m["flags"]["--dp-launch"] == "slurm" and m["flags"]["--gpus"] == str(k), m["flags"]
assert "--dp-launch slurm" in m["replay"], m["replay"]
PY
done

# Batch norm across processes: local (running statistics from group 0, on rank 0) and sync (the
# global batch's statistics, gathered over the ranks every layer): the threads' bits either way.
two_conv=("${common[@]}")
common=("${common[@]/two-conv/smallcnn-bn}")
for bn in local sync; do
  "$TRAIN" "${common[@]}" --epochs 1 --batchnorm $bn --gpus 2 --out bn-threads-$bn > /dev/null
  launch 2 $([ $bn = local ] && echo 111 || echo 112) bn-$bn --epochs 1 --batchnorm $bn --dp-launch slurm --out bn-procs-$bn
  [ "$(cat rc-bn-$bn-0)" = 0 ] && [ "$(cat rc-bn-$bn-1)" = 0 ] || { cat bn-$bn-rank*.txt >&2; fail "batch norm $bn ranks failed"; }
  a=$(fingerprint bn-threads-$bn); b=$(fingerprint bn-procs-$bn)
  echo "smallcnn-bn, batch norm $bn: threads $a, processes $b"
  [ "$a" = "$b" ] || fail "batch norm $bn: 2 processes end with other weights than 2 threads"
done
common=("${two_conv[@]}")

# Resumed: one epoch, then on to the second, both as processes: the two-epoch bits.
launch 2 201 part --epochs 1 --dp-launch slurm --out resumed
launch 2 202 rest --epochs 2 --dp-launch slurm --resume resumed
[ "$(cat rc-rest-0)" = 0 ] && [ "$(cat rc-rest-1)" = 0 ] || { cat rest-rank*.txt >&2; fail "the resumed ranks failed"; }
[ "$(fingerprint resumed)" = "$(fingerprint procs2)" ] || fail "a resumed two-process run ends elsewhere than an uninterrupted one"

# A rank that never comes: rank 0 gives up after --dp-timeout, naming what it waited for; nothing is left.
set +e
out=$(SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_JOB_ID=301 "$TRAIN" "${common[@]}" --epochs 1 --dp-launch slurm --dp-timeout 1 --out lonely 2>&1)
rc=$?
set -e
[ $rc != 0 ] && [[ $out == *"rank 1's part of exchange 0"* ]] || fail "a lonely rank 0: rc $rc, $out"
[ ! -e lonely ] || fail "a refused run left its folder behind"

# Ranks that train different things (another --lr on rank 1): both stop at the end of the epoch,
# when the replicas are compared, naming the first parameter that differs; nothing is left.
( set +e; SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_JOB_ID=303 "$TRAIN" "${common[@]}" --epochs 1 --dp-launch slurm --dp-timeout 30 --out mismatch > m0.txt 2>&1; echo $? > rc-m0 ) &
( set +e; SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_JOB_ID=303 "$TRAIN" "${common[@]}" --lr 0.01 --epochs 1 --dp-launch slurm --dp-timeout 30 --out mismatch > m1.txt 2>&1; echo $? > rc-m1 ) &
wait
[ "$(cat rc-m0)" != 0 ] && [ "$(cat rc-m1)" != 0 ] || fail "mismatched ranks: rc $(cat rc-m0) $(cat rc-m1)"
grep -q "rank 1's .* differs from rank 0's" m0.txt && grep -q "differs from rank 0's" m1.txt ||
  fail "mismatched ranks gave no reason: $(cat m0.txt m1.txt)"
[ ! -e mismatch ] || fail "the mismatched run left its folder behind"

# A finished run is never overwritten: rank 0 refuses, rank 1 says rank 0 never opened the folder.
launch 2 304 again --epochs 2 --dp-launch slurm --dp-timeout 2 --out procs2
[ "$(cat rc-again-0)" != 0 ] && grep -q "already holds" again-rank0.txt || fail "rank 0 took a finished run folder: $(cat again-rank0.txt)"
[ "$(cat rc-again-1)" != 0 ] && grep -q "did not start, refused the run" again-rank1.txt || fail "rank 1: $(cat again-rank1.txt)"
[ "$(fingerprint procs2)" = "$(fingerprint threads2)" ] || fail "the finished run changed"
echo "dp_processes: 2 and 4 processes give the threads' and one rank's bits; resume, timeout, mismatch and refusal hold"
