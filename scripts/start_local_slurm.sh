#!/usr/bin/env bash
# Start a one-machine SLURM cluster (munged + slurmctld + slurmd) for the sbatch tests.
#
# Needs root and the Debian packages slurm-wlm and munge (apt-get install -y slurm-wlm munge).
# The machine is one node named after this host (so `scontrol show hostnames` gives a name that
# resolves), with every CPU it has, no cgroups (proctrack/linuxproc, task/none) and no accounting.
# Idempotent: when `sinfo` already answers, nothing is started. State and logs go to
# ${ACCELERANDO_SLURM_DIR:-/tmp/accelerando-slurm}; stop it with `scripts/start_local_slurm.sh stop`.
set -euo pipefail

state=${ACCELERANDO_SLURM_DIR:-/tmp/accelerando-slurm}
conf_dir=/etc/slurm

if [[ "${1:-}" == "stop" ]]; then
    for daemon in slurmd slurmctld munged; do
        if [[ -f "$state/$daemon.pid" ]]; then
            kill "$(cat "$state/$daemon.pid")" 2>/dev/null || true
            rm -f "$state/$daemon.pid"
        fi
    done
    exit 0
fi

for tool in munged slurmctld slurmd sinfo; do
    if ! command -v "$tool" >/dev/null 2>&1 && [[ ! -x /usr/sbin/$tool ]]; then
        echo "start_local_slurm: $tool is missing. Fix: apt-get install -y slurm-wlm munge" >&2
        exit 3
    fi
done
if [[ $(id -u) -ne 0 ]]; then
    echo "start_local_slurm: the daemons need root. Fix: run it as root (or in the CI container)." >&2
    exit 3
fi

if timeout 5 sinfo >/dev/null 2>&1; then
    exit 0
fi

mkdir -p "$state/spool/ctld" "$state/spool/d" "$conf_dir" /run/munge /var/log/munge /var/lib/munge
host=$(hostname -s)
cpus=$(nproc)
memory_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)

cat >"$conf_dir/slurm.conf" <<EOF
# Written by accelerando's scripts/start_local_slurm.sh: a one-node test cluster.
ClusterName=accelerando-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state/spool/ctld
SlurmdSpoolDir=$state/spool/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=10
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

if [[ ! -s /etc/munge/munge.key ]]; then
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --force
    else
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
fi
chown -R root:root /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 0700 /etc/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key

if ! pgrep -x munged >/dev/null 2>&1; then
    munged --force --pid-file="$state/munged.pid"  # --force: root owns the key and folders here
fi
slurmctld -c   # -c: a fresh controller state (no jobs left over from an earlier run)
slurmd -c
for _ in $(seq 1 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        exit 0
    fi
    sleep 0.5
done
echo "start_local_slurm: the node did not become idle; see $state/slurmctld.log and $state/slurmd.log" >&2
sinfo >&2 || true
exit 4
