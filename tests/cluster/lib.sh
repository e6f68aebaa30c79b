# Shared settings for tests/cluster/{up,down,env.sh}. Sourced, not executed.
# shellcheck shell=bash
# HORUS_SLURM picks the Slurm: 22.05 (Debian's packages, the default and the demo's) or 25.11
# (built from ../shared/vendor by build-slurm into $HORUS_SLURM_PREFIX). Each version has its own
# state dir and ports, so both clusters can run side by side.
HORUS_SLURM="${HORUS_SLURM:-22.05}"
case "$HORUS_SLURM" in
    22.05) SLURM_PREFIX=""; _DEF_D=/tmp/horus-cluster; _DEF_PB=16800 ;;
    25.11) SLURM_PREFIX="${HORUS_SLURM_PREFIX:-/opt/slurm-25.11}"; _DEF_D=/tmp/horus-cluster-25.11; _DEF_PB=16900 ;;
    *) echo "[horus-cluster] ERROR: HORUS_SLURM=$HORUS_SLURM: need 22.05 or 25.11" >&2; exit 1 ;;
esac
# A dir (and port base) that env.sh set for the cluster it pointed at follows HORUS_SLURM; one
# set by hand is kept.
if [ -n "${HORUS_CLUSTER_DIR_AUTO:-}" ] && [ "${HORUS_CLUSTER_DIR:-}" != "$_DEF_D" ]; then
    unset HORUS_CLUSTER_DIR HORUS_CLUSTER_PORT_BASE
fi
D="${HORUS_CLUSTER_DIR:-$_DEF_D}"
CLUSTER="${HORUS_CLUSTER_NAME:-horus}"
_PB="${HORUS_CLUSTER_PORT_BASE:-$_DEF_PB}"
# The built Slurm's tools come first on PATH (its sbin holds slurmctld, slurmd, slurmdbd).
[ -n "$SLURM_PREFIX" ] && export PATH="$SLURM_PREFIX/bin:$SLURM_PREFIX/sbin:$PATH"
PORT_CTLD=$((_PB + 17))
PORT_DBD=$((_PB + 19))
PORT_SLURMD_A=$((_PB + 21))
PORT_SLURMD_T=$((_PB + 22))
PORT_MYSQL=$((_PB + 6))
MUNGE_SOCKET="$D/munge/munge.socket.2"
MYSQL_SOCKET="$D/run/mysqld.sock"
NODES=(gpu-a100 gpu-t4)
# Ordinary (non-root) test users made by up, with user-private groups and homes.
TEST_USERS=(horus-alice horus-bob)
# Root-owned horus folders of the test cluster (see README: "Ordinary users and the probe").
LEDGER_DIR="$D/ledger"          # 0755 root: the test ledger (sqlite), made by up, written by the Prolog's probe
FAKEGPU_DIR="$D/fakegpu"        # 1777: test jobs write <jobid>.json here (fake sampler, tests only)
HORUS_SPOOL_DIR="$D/horus-spool" # 0700 root: the probe's fallback spool
PROBE_RUN_DIR="$D/run/horus-probe" # 0700 root: pid files of running probes

log() { echo "[horus-cluster] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# fail MSG LOGFILE... : error with the tail of each log
fail() {
    local msg="$1"; shift
    log "ERROR: $msg"
    local f
    for f in "$@"; do
        [ -f "$f" ] || continue
        echo "----- tail -n 30 $f" >&2
        tail -n 30 "$f" >&2
    done
    exit 1
}

# is_running PIDFILE: the pid in PIDFILE is alive
is_running() {
    local pid
    [ -s "$1" ] || return 1
    pid="$(tr -dc 0-9 < "$1")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# wait_for WHAT SECONDS LOGFILE CMD...: retry CMD until it succeeds
wait_for() {
    local what="$1" secs="$2" logf="$3"; shift 3
    local deadline=$(( $(date +%s) + secs ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "$what not ready after ${secs}s" "$logf"
        sleep 0.3
    done
}

# mkfake FILE: character device standing in for a GPU
mkfake() {
    if [ ! -c "$1" ]; then rm -f "$1"; mknod "$1" c 1 3; fi
}

# write_if_changed FILE [MODE] < content: keep the file (and its mtime) when identical.
# CHANGED_FILES lists the existing files that were rewritten (up applies them to running daemons).
CHANGED_FILES=()
write_if_changed() {
    local f="$1" mode="${2:-644}" tmp
    tmp="$(mktemp "$f.XXXXXX")"
    cat > "$tmp"
    if [ -f "$f" ] && cmp -s "$tmp" "$f"; then rm -f "$tmp"; chmod "$mode" "$f"; return 0; fi
    if [ -f "$f" ]; then CHANGED_FILES+=("$f"); fi
    chmod "$mode" "$tmp"; mv -f "$tmp" "$f"
}

# allow_traverse DIR: give "others" the search (x) bit on DIR and each folder above it that lacks
# it (only x: nothing becomes listable or readable that was not). Prints what it changed.
allow_traverse() {
    local p="" part
    local IFS=/
    for part in $1; do
        [ -n "$part" ] || continue
        p="$p/$part"
        [ -d "$p" ] || return 0
        if [ "$(( 0$(stat -c %a "$p") & 1 ))" = 0 ]; then
            chmod o+x "$p"
            log "NOTE: chmod o+x $p (ordinary users must reach the Python and the repository)"
        fi
    done
}
