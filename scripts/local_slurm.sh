#!/usr/bin/env bash
# A private one-machine Slurm for tests and trials: its own munged, slurmctld and two slurmd
# ("nodes" gpu1 with Feature=gpu and cpu1 with Feature=cpu, both this host), so that
# heterogeneous jobs can be scheduled.
#
#   eval "$(scripts/local_slurm.sh start)"   # prints `export SLURM_CONF=...`; then sbatch, srun, ...
#   scripts/local_slurm.sh env               # the same export lines, for another shell
#   scripts/local_slurm.sh status
#   scripts/local_slurm.sh stop              # cancels its jobs, ends only the daemons it started
#
# Everything it writes is under $HETGRAD_SLURM_DIR (default <repo>/.slurm): slurm.conf (used
# through SLURM_CONF), the munge key and socket (slurm.conf's AuthInfo names it), state, spool,
# logs, pid files and per-node TmpFS (PMIx puts a step's spmix_appdir there; one shared /tmp
# would make the two slurmd of a hetjob step collide). It never reads or writes /etc/slurm or
# /etc/munge, picks free ports, and stops processes by its own pid files only. Waits are short
# for tests: a requeued job waits cred_expire + 1 s before it starts again (6 s here, Slurm's
# default 121 s), and both schedulers run every second (a hetjob starts only through the
# backfill scheduler: 30 s by default).
# `start` and `stop` are idempotent. Diagnostics go to stderr, export lines to stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${HETGRAD_SLURM_DIR:-$ROOT/.slurm}
NODES=(gpu1 cpu1)
FEATURES=(gpu cpu)

say() { echo "local_slurm: $*" >&2; }
die() { say "error: $*"; exit 1; }

# --- processes, by pid file ------------------------------------------------------------
pid_of() {   # the pid in pid file $1 if it still runs our $2 (named so, started with our dir)
  local f=$1 name=$2 pid
  [ -s "$f" ] || return 0
  pid=$(tr -dc 0-9 < "$f")
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] \
    && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "$DIR/" && echo "$pid"
  return 0
}

daemons() {  # "pidfile name" per daemon this cluster starts
  echo "$DIR/run/munged.pid munged"
  echo "$DIR/run/slurmctld.pid slurmctld"
  for n in "${NODES[@]}"; do echo "$DIR/run/slurmd-$n.pid slurmd"; done
}

running() {  # how many of our daemons are alive
  local count=0 f name
  while read -r f name; do [ -n "$(pid_of "$f" "$name")" ] && count=$((count + 1)); done < <(daemons)
  echo "$count"
}

our_stepds() {  # slurmstepd processes of this cluster (they carry our SLURM_CONF)
  local p
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
    tr '\0' '\n' 2>/dev/null < "$p/environ" | grep -qx "SLURM_CONF=$DIR/slurm.conf" && echo "${p#/proc/}"
  done
  return 0
}

end_pids() {  # SIGTERM, wait up to 20 s, then SIGKILL, and wait until gone
  local pids=("$@") alive=() i p
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for i in $(seq 1 100); do
    alive=()
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    [ ${#alive[@]} -eq 0 ] && return 0
    [ "$i" -eq 100 ] && { say "killing ${alive[*]}"; kill -KILL "${alive[@]}" 2>/dev/null || true; }
    sleep 0.2
  done
  for p in "${alive[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
}

# --- configuration ---------------------------------------------------------------------
free_ports() {  # $1 consecutive TCP ports nobody listens on, from 16817 up
  local want=$1 port=16817 n used
  used=$(ss -Hltn 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u)
  while :; do
    for ((n = 0; n < want; n++)); do
      grep -qx "$((port + n))" <<< "$used" && break
    done
    [ "$n" -eq "$want" ] && { echo "$port"; return; }
    port=$((port + n + 1))
  done
}

write_conf() {
  local host cpus port i
  host=$(hostname -s)
  cpus=$(nproc)
  port=$(free_ports $((1 + ${#NODES[@]})))
  : > "$DIR/plugstack.conf"   # no site SPANK plugins in our jobs
  cat > "$DIR/slurm.conf" <<CONF
# written by scripts/local_slurm.sh: a private test cluster, not for production
ClusterName=hetgrad-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=$port
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=5
CredType=cred/munge
PlugStackConfig=$DIR/plugstack.conf
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=10
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
CONF
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1 + i)) CPUs=$cpus Feature=${FEATURES[$i]} State=UNKNOWN" >> "$DIR/slurm.conf"
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >> "$DIR/slurm.conf"
}

# --- commands ----------------------------------------------------------------------------
exports() {
  echo "export SLURM_CONF=$DIR/slurm.conf"
  echo "export HETGRAD_SLURM_DIR=$DIR"
}

start() {
  for d in slurmctld slurmd munged sinfo; do
    command -v "$d" >/dev/null || die "no $d: install Slurm and munge (scripts/setup.sh does)"
  done
  local n_daemons
  n_daemons=$(daemons | wc -l)
  case $(running) in
    0) ;;
    "$n_daemons") say "already running ($DIR)"; exports; return 0 ;;
    *) say "some daemons are down; restarting"; stop ;;
  esac
  [ ${#DIR} -lt 80 ] || die "HETGRAD_SLURM_DIR is too long for a socket path: $DIR"
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  mkdir -p "$DIR"/{munge,run,log,state}
  for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n" "$DIR/tmp/$n"; done
  chmod 1777 "$DIR"/tmp/*   # a TmpFS, like /tmp
  if [ ! -s "$DIR/munge/munge.key" ]; then
    (umask 077; dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none)
  fi
  write_conf
  export SLURM_CONF=$DIR/slurm.conf
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" 2>> "$DIR/log/munged.log" \
    || die "munged did not start; see $DIR/log/munged.log"
  slurmctld -f "$SLURM_CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
  for n in "${NODES[@]}"; do
    slurmd -f "$SLURM_CONF" -N "$n" || die "slurmd $n did not start; see $DIR/log/slurmd-$n.log"
  done
  for _ in $(seq 1 60); do
    if [ "$(sinfo -h -o '%T' 2>/dev/null | grep -c -E '^(idle|mixed|allocated)$')" -ge 1 ] \
       && ! sinfo -h -N -o '%T' 2>/dev/null | grep -qvE '^(idle|mixed|allocated)$'; then
      sinfo -N -o '%N %T %f' >&2
      exports
      return 0
    fi
    sleep 1
  done
  sinfo -N >&2 || true
  die "nodes did not become idle in 60 s; see $DIR/log"
}

stop() {
  [ -d "$DIR/run" ] || { say "nothing to stop in $DIR"; return 0; }
  local pids=() f name pid
  if [ -n "$(pid_of "$DIR/run/slurmctld.pid" slurmctld)" ]; then   # cancel our jobs first
    # (no --state: Slurm 22.05 refuses a list of states, and the cancel would not happen)
    SLURM_CONF=$DIR/slurm.conf scancel --quiet --full --user="$(id -un)" 2>/dev/null || true
  fi
  mapfile -t stepds < <(our_stepds)
  end_pids "${stepds[@]}"
  local slurm=() munge=()
  while read -r f name; do   # the Slurm daemons together (their jobs are gone), then munged
    pid=$(pid_of "$f" "$name")
    [ -n "$pid" ] || continue
    pids+=("$pid")
    if [ "$name" = munged ]; then munge+=("$pid"); else slurm+=("$pid"); fi
  done < <(daemons)
  end_pids "${slurm[@]}"
  end_pids "${munge[@]}"
  rm -f "$DIR"/run/*.pid
  say "stopped (${#pids[@]} daemons, ${#stepds[@]} job steps)"
}

status() {
  local f name
  while read -r f name; do
    echo "$(basename "$f" .pid): $(pid_of "$f" "$name" | grep . || echo down)"
  done < <(daemons)
  [ "$(running)" -gt 0 ] && SLURM_CONF=$DIR/slurm.conf sinfo -N -o '%N %T %f'
  return 0
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) [ "$(running)" -gt 0 ] || die "not running (scripts/local_slurm.sh start)"; exports ;;
  status) status ;;
  *) echo "usage: $0 start|stop|env|status" >&2; exit 2 ;;
esac
