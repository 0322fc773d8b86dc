#!/usr/bin/env bash
# A settings study on a real Slurm cluster: munge and a one-node Slurm (slurmctld + slurmd, this
# machine's CPUs as its resources) started here under a scratch folder, a small CPU study planned
# with ditto-experiment --plan, submitted with sbatch as an array job, collected with --collect,
# and every replica's weights fingerprint compared with the same study run locally. Then one
# data-parallel run whose two ranks are the tasks of one srun step (ditto-train --dp-launch slurm),
# compared with the same ranks as threads of one process; and a planned study whose replicas are
# each two such tasks (--slurm-dp-launch), against the same study run locally with threads. Needs root or password-less sudo (the
# daemons) and Debian's slurm-wlm and munge (scripts/test.sh installs them).
#   slurm_study.sh DITTO_EXPERIMENT WORK_DIR DITTO_TRAIN
set -euo pipefail
EXP=$1
W=$2
TRAIN=$3
for b in munged slurmctld slurmd sbatch squeue sinfo srun python3; do
  command -v "$b" > /dev/null || { echo "slurm_study: $b not found (install slurm-wlm and munge)" >&2; exit 1; }
done
# The daemons run as root (directly, or through password-less sudo); the study runs as this user.
sudo=()
if [ "$(id -u)" != 0 ]; then
  sudo -n true 2> /dev/null || { echo "slurm_study: the Slurm daemons need root or password-less sudo" >&2; exit 1; }
  sudo=(sudo -n)
fi
rm -rf "$W"
mkdir -p "$W"/{state,spool,log,munge,run}
stop() {
  for f in "$W"/run/slurmd.pid "$W"/run/slurmctld.pid "$W"/munge/munged.pid; do
    [ -f "$f" ] && "${sudo[@]}" kill "$(cat "$f")" 2> /dev/null || true
  done
}
trap stop EXIT

# Ports of our own, so a cluster already on this machine (or a second test run) is not disturbed.
base=$(( 20000 + $$ % 20000 ))
host=$(hostname -s 2> /dev/null || uname -n | cut -d. -f1)
dd if=/dev/urandom bs=1 count=1024 of="$W/munge/munge.key" 2> /dev/null
chmod 400 "$W/munge/munge.key"
[ ${#sudo[@]} = 0 ] || "${sudo[@]}" chown root: "$W/munge/munge.key"
"${sudo[@]}" munged --key-file="$W/munge/munge.key" --socket="$W/munge/munge.socket" --pid-file="$W/munge/munged.pid" \
  --log-file="$W/munge/munged.log" --seed-file="$W/munge/seed" -f
cat > "$W/slurm.conf" <<CONF
ClusterName=dittotest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$W/munge/munge.socket
CryptoType=crypto/munge
SlurmctldPort=$base
SlurmdPort=$(( base + 1 ))
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ditto Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$W/slurm.conf"
"${sudo[@]}" slurmctld -c -f "$SLURM_CONF"
"${sudo[@]}" slurmd -f "$SLURM_CONF"
for i in $(seq 60); do
  sinfo -h -o %t 2> /dev/null | grep -q idle && break
  [ "$i" = 60 ] && { echo "slurm_study: the node never became idle" >&2; cat "$W"/log/*.log >&2; exit 1; }
  sleep 0.5
done

study=(--model two-conv --synthetic-train 96 --synthetic-test 48 --synthetic-size 16 --batch-size 32 --epochs 1
       --settings ALGO,CONTROL --replicas 2 --bootstrap 100 --loader-threads 0)
# Submits a plan's array job and waits for it to end.
run_plan() {
  local job i
  job=$(sbatch --parsable "$1/study.sbatch")
  for i in $(seq 600); do
    [ -z "$(squeue -h -j "$job" 2> /dev/null)" ] && return 0
    sleep 0.5
  done
  echo "slurm_study: job $job still queued or running after 300 s" >&2; squeue >&2; cat "$1"/slurm/*.out >&2; exit 1
}
# Every replica of the local study ($1) and the collected one ($2) end with the same weights, and
# their reports agree.
same_study() {
python3 - "$1" "$2" <<'PY'
import json, pathlib, sys
local, study = map(pathlib.Path, sys.argv[1:])
runs = sorted(p.name for p in local.iterdir() if (p / "manifest.json").exists())
assert len(runs) == 4, runs
for r in runs:
    a = json.loads((local / r / "manifest.json").read_text())["results"]["weights_fingerprint"]
    b = json.loads((study / r / "manifest.json").read_text())["results"]["weights_fingerprint"]
    print(f"{r}: local {a}, slurm {b}")
    assert a == b, f"{r}: the Slurm replica's weights differ from the local one's"
rep = lambda d: {(m["setting"], m["metric"]): m["value"] for m in json.loads((d / "report.json").read_text())["metrics"]}
a, b = rep(local), rep(study)
for key in [k for k in a if k[1] in ("churn", "accuracy_mean", "weight_l2", "distinct_fingerprints")]:
    assert a[key] == b[key], f"{key}: local {a[key]}, collected {b[key]}"
print(f"slurm_study: 4 replicas trained by Slurm equal the local study's, report metrics equal ({study.name})")
PY
}

"$EXP" "${study[@]}" --device cpu --out "$W/local" > "$W/local.txt"
"$EXP" "${study[@]}" --plan --slurm-partition ditto --out "$W/study"
run_plan "$W/study"
"$EXP" "${study[@]}" --collect --out "$W/study" > "$W/collect.txt"
same_study "$W/local" "$W/study"

# Data parallelism over Slurm tasks: srun starts two ranks, Slurm's environment tells each which
# it is, they meet in the run folder; the weights are those of the same two ranks as threads.
dp=(--device cpu --model two-conv --synthetic-train 96 --synthetic-test 48 --synthetic-size 16 --batch-size 32
    --epochs 2 --loader-threads 0 --deterministic-init --deterministic-input --kernels deterministic --quiet)
"$TRAIN" "${dp[@]}" --gpus 2 --out "$W/dp-threads" > /dev/null
srun --ntasks 2 --kill-on-bad-exit=1 "$TRAIN" "${dp[@]}" --dp-launch slurm --dp-timeout 120 --out "$W/dp-srun" \
  > "$W/dp-srun.txt"
python3 - "$W/dp-threads" "$W/dp-srun" <<'PY'
import json, pathlib, sys
threads, srun = (json.loads((pathlib.Path(d) / "manifest.json").read_text()) for d in sys.argv[1:])
a, b = threads["results"]["weights_fingerprint"], srun["results"]["weights_fingerprint"]
print(f"data parallel, 2 ranks: threads {a}, srun tasks {b}")
assert a == b, "the two srun tasks end with other weights than two threads"
assert srun["data_parallel"]["processes"]["world"] == 2, srun["data_parallel"]
PY
grep -q "^rank 1: trained" "$W/dp-srun.txt" || { cat "$W/dp-srun.txt" >&2; exit 1; }
echo "slurm_study: two srun tasks as data-parallel ranks equal two threads"

# A planned study whose replicas are data parallel over two Slurm tasks each: every array task runs
# srun, whose two tasks are the replica's ranks; the same study with the ranks as threads, locally.
dps=(--model two-conv --synthetic-train 96 --synthetic-test 48 --synthetic-size 16 --batch-size 32 --epochs 1
     --settings ALGO,CONTROL --replicas 2 --bootstrap 100 --loader-threads 0 --dp-gpus 2)
"$EXP" "${dps[@]}" --device cpu --out "$W/dp-local" > "$W/dp-local.txt"
"$EXP" "${dps[@]}" --plan --slurm-dp-launch --slurm-partition ditto --out "$W/dp-study"
grep -q "^srun --ntasks=2 --kill-on-bad-exit=1 .* --dp-launch slurm " "$W/dp-study/tasks.txt" ||
  { echo "slurm_study: the planned tasks do not start their ranks with srun" >&2; cat "$W/dp-study/tasks.txt" >&2; exit 1; }
grep -q "^#SBATCH --ntasks=2$" "$W/dp-study/study.sbatch" || { cat "$W/dp-study/study.sbatch" >&2; exit 1; }
run_plan "$W/dp-study"
"$EXP" "${dps[@]}" --slurm-dp-launch --collect --out "$W/dp-study" > "$W/dp-collect.txt"
same_study "$W/dp-local" "$W/dp-study"
