#!/usr/bin/env bash
# Start or stop a one-machine Slurm (munge + slurmctld + slurmd) for tests and trials.
#   scripts/local_slurm.sh start    # writes /etc/slurm/slurm.conf, starts the daemons, waits for idle
#   scripts/local_slurm.sh stop
# Two NodeName entries on this host (gpu1, cpu1) so heterogeneous jobs can be scheduled.
set -euo pipefail
cmd=${1:-start}
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)
CPUS=$(nproc)

stop() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  pkill -x munged 2>/dev/null || true
  sleep 1
}

start() {
  command -v slurmctld >/dev/null || { echo "slurm not installed: scripts/setup.sh --with-slurm" >&2; exit 1; }
  stop
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge /var/log/munge /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  chmod 700 /etc/munge
  if id munge >/dev/null 2>&1; then
    su -s /bin/sh munge -c "munged --force" 2>/dev/null || munged --force
  else
    munged --force
  fi
  cat > "$CONF" <<CONF
ClusterName=hetgrad
SlurmctldHost=$HOST
SlurmUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmdPidFile=/var/run/slurmd-%n.pid
SlurmctldPidFile=/var/run/slurmctld.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
MpiDefault=none
NodeName=gpu1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=17001 CPUs=$CPUS Feature=gpu State=UNKNOWN
NodeName=cpu1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=17002 CPUs=$CPUS Feature=cpu State=UNKNOWN
PartitionName=debug Nodes=gpu1,cpu1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  mkdir -p /var/spool/slurmd/gpu1 /var/spool/slurmd/cpu1
  slurmctld
  slurmd -N gpu1
  slurmd -N cpu1
  for _ in $(seq 1 60); do
    if sinfo -h -o "%T" 2>/dev/null | grep -q idle; then
      sinfo
      return 0
    fi
    sleep 1
  done
  echo "local slurm did not become idle; see /var/log/slurm" >&2
  sinfo >&2 || true
  exit 1
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
