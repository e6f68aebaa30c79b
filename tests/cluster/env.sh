# Source me: point the Slurm client tools (sbatch, squeue, sacct, scontrol, sinfo, sacctmgr)
# at the local test cluster started by tests/cluster/up.
#   source tests/cluster/env.sh                    # the 22.05 cluster (/tmp/horus-cluster)
#   HORUS_SLURM=25.11 source tests/cluster/env.sh  # the 25.11 cluster (/tmp/horus-cluster-25.11)
#   HORUS_SLURM=22.05 source tests/cluster/env.sh  # back to 22.05 in the same shell
# The munge socket, ports and the slurmdbd address are all read from this slurm.conf.
# A HORUS_CLUSTER_DIR set by an earlier source follows HORUS_SLURM; one set by hand is kept.
if [ -z "${HORUS_CLUSTER_DIR:-}" ] || [ -n "${HORUS_CLUSTER_DIR_AUTO:-}" ]; then
    case "${HORUS_SLURM:-22.05}" in
        25.11) HORUS_CLUSTER_DIR=/tmp/horus-cluster-25.11 ;;
        *) HORUS_CLUSTER_DIR=/tmp/horus-cluster ;;
    esac
    export HORUS_CLUSTER_DIR_AUTO=1
fi
export HORUS_CLUSTER_DIR
# A Slurm prefix put on PATH by an earlier source (the other cluster) comes off first.
if [ -n "${SLURM_PREFIX:-}" ]; then
    PATH=":$PATH:"; PATH="${PATH//:$SLURM_PREFIX\/bin:/:}"; PATH="${PATH#:}"; PATH="${PATH%:}"
    unset SLURM_PREFIX
fi
export SLURM_CONF="$HORUS_CLUSTER_DIR/etc/slurm.conf"
# Which Slurm the cluster runs, its prefix and ports (written by up).
if [ -f "$HORUS_CLUSTER_DIR/etc/horus-cluster.env" ]; then
    while IFS='=' read -r _k _v; do
        case "$_k" in HORUS_SLURM|SLURM_PREFIX|HORUS_CLUSTER_PORT_BASE) export "$_k=$_v" ;; esac
    done < "$HORUS_CLUSTER_DIR/etc/horus-cluster.env"
    unset _k _v
fi
# A built Slurm (25.11): its client tools come first for everyone.
if [ -n "${SLURM_PREFIX:-}" ]; then
    case ":$PATH:" in *":$SLURM_PREFIX/bin:"*) ;; *) export PATH="$SLURM_PREFIX/bin:$PATH" ;; esac
fi
# Ordinary users (horus-alice, horus-bob): the project's Python and console scripts, linked by up
# into $HORUS_CLUSTER_DIR/bin (root keeps its own PATH).
if [ "$(id -u)" != 0 ]; then
    case ":$PATH:" in *":$HORUS_CLUSTER_DIR/bin:"*) ;; *) export PATH="$HORUS_CLUSTER_DIR/bin:$PATH" ;; esac
fi
if [ ! -f "$SLURM_CONF" ]; then
    echo "horus-cluster: $SLURM_CONF missing; run tests/cluster/up first" >&2
fi
