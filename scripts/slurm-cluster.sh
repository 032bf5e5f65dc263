#!/usr/bin/env bash
# A single-node Slurm cluster for CI, without systemd or cgroups: Debian's slurm-wlm and
# munge, every daemon's file under BASE. `up` installs what is missing, starts munged,
# slurmctld and slurmd and waits for the node to be idle; `down` stops them.
#
# usage: scripts/slurm-cluster.sh up|down BASE      then: export SLURM_CONF=BASE/etc/slurm.conf
#
# Settings chosen for tests: jobs may be requeued (JobRequeue=1); a requeued job starts
# again in about 20 s rather than Slurm's default 2 minutes (munge credentials expire
# after 10 s, the scheduler runs every 2 s); srun's MPI plugin is PMIx, which Debian's
# Open MPI speaks (it has no PMI-2 client); Slurm's pmix plugin loads the unversioned
# libpmix.so, which only libpmix-dev installs.
set -euo pipefail
action=$1
base=$(realpath -m "$2")
conf=$base/etc/slurm.conf
munge=$base/munge

stop() {
  for daemon in slurmd slurmctld munged; do
    local file=$base/run/$daemon.pid
    [ "$daemon" = munged ] && file=$munge/munged.pid
    [ -f "$file" ] || continue
    local pid
    pid=$(cat "$file")
    kill -TERM "$pid" 2> /dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2> /dev/null || true
  done
}

case $action in
  down)
    SLURM_CONF=$conf scancel --user=root --full 2> /dev/null || true
    stop
    exit 0
    ;;
  up) ;;
  *) echo "usage: $0 up|down BASE" >&2; exit 2 ;;
esac

missing=()
for pkg in slurm-wlm munge libpmix-dev; do dpkg -s "$pkg" > /dev/null 2>&1 || missing+=("$pkg"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" > /dev/null
fi
mkdir -p "$base"/{etc,state,spool,log,run} "$munge"
# munged refuses a socket that others cannot reach: every directory on its path must let
# them through (mktemp -d makes BASE 700).
chmod 711 "$base" "$munge"
[ -f "$munge/munge.key" ] || mungekey -c -k "$munge/munge.key"
munged --key-file="$munge/munge.key" --socket="$munge/socket" --pid-file="$munge/munged.pid" \
  --log-file="$munge/munged.log" --seed-file="$munge/munged.seed"
host=$(hostname)
memory=$(($(free -m | awk '/^Mem:/ {print $2}') - 1024))
cat > "$conf" <<CONF
ClusterName=wick-ci
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge/socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$base/state
SlurmdSpoolDir=$base/spool
SlurmctldPidFile=$base/run/slurmctld.pid
SlurmdPidFile=$base/run/slurmd.pid
SlurmctldLogFile=$base/log/slurmctld.log
SlurmdLogFile=$base/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SwitchType=switch/none
MpiDefault=pmix
JobRequeue=1
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
PlugStackConfig=$base/etc/plugstack.conf
InactiveLimit=0
MinJobAge=300
KillWait=10
NodeName=$host CPUs=$(nproc) RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
: > "$base/etc/plugstack.conf"
export SLURM_CONF=$conf
slurmctld -f "$conf" -c
slurmd -f "$conf"
for _ in $(seq 300); do
  [ "$(sinfo -h -o %T 2> /dev/null | sort -u)" = idle ] && break
  sleep 0.1
done
[ "$(sinfo -h -o %T | sort -u)" = idle ] || { tail -20 "$base"/log/*.log; echo "slurm: the node is not idle" >&2; exit 1; }
echo "slurm: up, SLURM_CONF=$conf"
