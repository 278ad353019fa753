#!/usr/bin/env bash
# Bring up (or stop) a real one-node Slurm cluster on this machine, for tests.
#
#   scripts/slurm_single_node.sh          # install if needed, start, wait until the node is idle
#   scripts/slurm_single_node.sh --stop   # stop the daemons this script started
#
# Idempotent: running it again while everything is up only re-checks and prints
# the summary line.  Designed for Debian 12 (Slurm 22.05) inside a container/VM
# without systemd and without usable cgroups.
#
# Exit codes: 0 = Slurm is up (summary on stdout) / stopped,
#             2 = Slurm cannot be provided here (one-line reason on stderr; callers
#                 should skip their Slurm tests and name that reason),
#             1 = something unexpected failed while starting (log tail on stderr).
set -euo pipefail

PARTITION=debug
SLURM_CONF=/etc/slurm/slurm.conf
STATE_DIR=/run/slurm-single-node          # our pid files and "started by us" markers
LOG_DIR=/var/log/slurm
CTLD_SPOOL=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
JOBCOMP_LOG=$LOG_DIR/jobcomp.log
MUNGE_KEY=/etc/munge/munge.key
WAIT_SECONDS=${SLURM_SINGLE_NODE_WAIT:-60}
CONF_MARKER="# Written by scripts/slurm_single_node.sh"

die_skip() { echo "slurm_single_node: $*" >&2; exit 2; }
die() { echo "slurm_single_node: $*" >&2; exit 1; }
log() { echo "slurm_single_node: $*" >&2; }

HOST=$(hostname -s)

# --- helpers ---------------------------------------------------------------

# pid_alive PIDFILE NAME: the pid in PIDFILE is running and its command is NAME.
pid_alive() {
    local pidfile=$1 name=$2 pid
    [[ -s $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]]
}

# running NAME: some process with exactly this command name exists (ours or not).
running() { pgrep -x "$1" >/dev/null 2>&1; }

node_state() { sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -n1; }

summary() {
    local cpus mem
    read -r cpus mem < <(sinfo -h -N -n "$HOST" -o '%c %m' | head -n1)
    echo "slurm up: partition $PARTITION, node $HOST, $cpus CPUs, $mem MB"
}

cluster_ready() {
    command -v sinfo >/dev/null 2>&1 || return 1
    scontrol ping >/dev/null 2>&1 || return 1
    case "$(node_state)" in idle|mixed|allocated|completing) return 0 ;; esac
    return 1
}

# stop_ours NAME: kill the daemon NAME if (and only if) this script started it.
stop_ours() {
    local name=$1 pidfile=$STATE_DIR/$1.pid pid i
    if [[ -e $STATE_DIR/$name.ours ]] && pid_alive "$pidfile" "$name"; then
        pid=$(tr -dc '0-9' <"$pidfile")
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do
            [[ -d /proc/$pid ]] || break
            sleep 0.2
        done
        if [[ -d /proc/$pid ]]; then
            log "$name (pid $pid) ignored SIGTERM for 10s, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "stopped $name (pid $pid)"
        rm -f "$pidfile"
    fi
    rm -f "$STATE_DIR/$name.ours"
}

# --- --stop ------------------------------------------------------------------

if [[ ${1:-} == --stop ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        sudo -n true 2>/dev/null || die_skip "--stop needs root (or passwordless sudo)"
        exec sudo -n -- bash "$0" "$@"
    fi
    # Jobs still running would outlive slurmd (their slurmstepd is detached),
    # so cancel everything in our partition first and give it KillWait to end.
    if [[ -e $STATE_DIR/slurmctld.ours ]] && scontrol ping >/dev/null 2>&1; then
        scancel --partition="$PARTITION" 2>/dev/null || true
        for _ in $(seq 1 30); do
            [[ -z $(squeue -h -p "$PARTITION" -t RUNNING,COMPLETING -o %i 2>/dev/null) ]] && break
            sleep 0.5
        done
    fi
    # Order matters: slurmd and slurmctld still talk to munged while shutting down.
    stop_ours slurmd
    stop_ours slurmctld
    stop_ours munged
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--stop]" >&2
    exit 64
fi

# --- non-root: fine if it is already up, otherwise re-run via sudo -------------
# (root always takes the full path below, which is idempotent and also applies
# changes of this script's slurm.conf to a running cluster.)

if [[ $(id -u) -ne 0 ]]; then
    if cluster_ready; then
        summary
        exit 0
    fi
    if sudo -n true 2>/dev/null; then
        exec sudo -n -- bash "$0" "$@"
    fi
    die_skip "Slurm is not running and starting it needs root (or passwordless sudo)"
fi

# --- 1. install ----------------------------------------------------------------

missing=()
for b in sbatch slurmctld slurmd munged; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
done
if ((${#missing[@]})); then
    command -v apt-get >/dev/null 2>&1 \
        || die_skip "missing ${missing[*]} and no apt-get to install slurmctld slurmd slurm-client munge"
    log "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
    install_log=$(mktemp /tmp/slurm-single-node-apt.XXXXXX)
    apt_install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            slurmctld slurmd slurm-client munge >>"$install_log" 2>&1
    }
    # Retry once after refreshing the package lists (stale lists -> 404s).
    if ! apt_install; then
        DEBIAN_FRONTEND=noninteractive apt-get update >>"$install_log" 2>&1 || true
        apt_install || die_skip "apt-get install of slurmctld slurmd slurm-client munge failed (see $install_log)"
    fi
    rm -f "$install_log"
    for b in sbatch slurmctld slurmd munged; do
        command -v "$b" >/dev/null 2>&1 || die_skip "$b still missing after apt-get install"
    done
fi

mkdir -p "$STATE_DIR" "$LOG_DIR" "$CTLD_SPOOL" "$SLURMD_SPOOL"

# --- 2. munge ------------------------------------------------------------------

if [[ ! -s $MUNGE_KEY ]]; then
    # The Debian postinst normally creates one; make it ourselves if not.
    install -d -o munge -g munge -m 0700 /etc/munge
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile="$MUNGE_KEY" --force
    else
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    fi
fi
chown munge:munge "$MUNGE_KEY"
chmod 0400 "$MUNGE_KEY"

if ! running munged; then
    # Without systemd nobody creates the runtime/log dirs for munge.
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    # Run it as the munge user (as root it would own its files wrongly).
    # --force: tolerate a stale socket/pid file left by a killed munged
    # (common after a container restart).  It writes /run/munge/munged.pid.
    runuser -u munge -- munged --force \
        || die "munged failed to start: $(tail -n 3 /var/log/munge/munged.log 2>/dev/null)"
    ln -sfn /run/munge/munged.pid "$STATE_DIR/munged.pid"
    touch "$STATE_DIR/munged.ours"
fi
for _ in $(seq 1 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.2
done
munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munge credential round-trip fails"

# --- 3. slurm.conf ---------------------------------------------------------------

# nproc obeys OMP_NUM_THREADS: a caller that pins its own threads (parallel test workers set 1) would get a
# one-CPU node, which refuses every job of more than one process ("More processors requested than permitted").
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
mem_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))
# Headroom: slurmd drains the node ("Low RealMemory") if it sees less memory
# than configured, and the OS needs some anyway: keep 5% or 512 MB back.
headroom=$(( mem_mb / 20 > 512 ? mem_mb / 20 : 512 ))
real_mem=$(( mem_mb - headroom > 256 ? mem_mb - headroom : mem_mb ))

conf_tmp=$(mktemp /tmp/slurm-single-node-conf.XXXXXX)
cat >"$conf_tmp" <<EOF
$CONF_MARKER for host $HOST.
# One node, one partition; re-written on every run (keep local edits elsewhere).
ClusterName=single
SlurmctldHost=$HOST
# Everything runs as root: no slurm-user permission juggling on spool/log dirs.
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
# No systemd and no writable cgroup hierarchy in a container: track job
# processes via /proc (linuxproc), no task binding, no cgroup accounting.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No slurmdbd, so plain sacct fails ("accounting storage is disabled").
# Finished jobs stay visible to scontrol/squeue -t all for MinJobAge seconds,
# and one line per finished job goes to the jobcomp text file below, which
# "sacct -c" (--completion) can read, e.g. sacct -c -j ID -o jobid,state,elapsed.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$JOBCOMP_LOG
MinJobAge=3600
# CPUs (not cores) and memory are the consumable resources, so --cpus-per-task
# and --mem are both enforced at scheduling time.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# Reject at submit time (instead of pending forever with Reason=PartitionConfig)
# jobs that ask for more CPUs/nodes/time than the partition can ever give.
EnforcePartLimits=ALL
# Jobs that do not ask for memory get this much per CPU (otherwise one job
# would take the whole node's memory and block every other job).
DefMemPerCPU=512
# Start jobs right after submission (default batching delays them up to ~3s).
SchedulerParameters=batch_sched_delay=0
# Time limits: no grace minutes; SIGTERM -> SIGKILL gap is KillWait seconds.
# (slurmctld only checks limits every ~30s, so a timeout fires 0-30s late.)
OverTimeLimit=0
KillWait=5
InactiveLimit=0
# A node that was down (e.g. slurmd restarted) comes back by itself once it
# registers with a valid configuration.
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$CTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$HOST CPUs=$cpus RealMemory=$real_mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

conf_changed=0
if ! cmp -s "$conf_tmp" "$SLURM_CONF" 2>/dev/null; then
    if [[ -e $SLURM_CONF ]] && ! grep -qF "$CONF_MARKER" "$SLURM_CONF"; then
        # Not ours: keep a copy rather than silently destroying it.
        cp -p "$SLURM_CONF" "$SLURM_CONF.before-single-node"
        log "existing $SLURM_CONF saved as $SLURM_CONF.before-single-node"
    fi
    install -D -m 0644 "$conf_tmp" "$SLURM_CONF"
    conf_changed=1
fi
rm -f "$conf_tmp"

# --- 4. daemons --------------------------------------------------------------------

if ! running slurmctld; then
    # Daemonises itself and writes SlurmctldPidFile.  No -c: keep the saved
    # state (queued jobs, finished-job records) across restarts.
    slurmctld || die "slurmctld failed to start: $(tail -n 5 "$LOG_DIR/slurmctld.log" 2>/dev/null)"
    touch "$STATE_DIR/slurmctld.ours"
elif ((conf_changed)); then
    scontrol reconfigure || true
fi

for _ in $(seq 1 $((WAIT_SECONDS * 2))); do
    scontrol ping >/dev/null 2>&1 && break
    sleep 0.5
done
scontrol ping >/dev/null 2>&1 \
    || die "slurmctld not answering after ${WAIT_SECONDS}s: $(tail -n 5 "$LOG_DIR/slurmctld.log" 2>/dev/null)"

if ! running slurmd; then
    slurmd || die "slurmd failed to start: $(tail -n 5 "$LOG_DIR/slurmd.log" 2>/dev/null)"
    touch "$STATE_DIR/slurmd.ours"
fi

deadline=$((SECONDS + WAIT_SECONDS))
resumed=0
while :; do
    state=$(node_state || true)
    case "$state" in
        idle|mixed|allocated|completing) break ;;
        down*|drain*|fail*)
            # e.g. "Not responding" / "Low RealMemory" from an earlier run.
            if ((!resumed)); then
                scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
                resumed=1
            fi
            ;;
    esac
    if ((SECONDS >= deadline)); then
        reason=$(sinfo -h -N -n "$HOST" -o '%E' 2>/dev/null || true)
        die "node $HOST not idle after ${WAIT_SECONDS}s (state '${state:-?}', reason '${reason:-}'): $(tail -n 3 "$LOG_DIR/slurmd.log" 2>/dev/null)"
    fi
    sleep 0.5
done

summary
