# Source me: point the Slurm client tools (sbatch, squeue, sacct, scontrol, sinfo, sacctmgr)
# at the local test cluster started by tests/cluster/up.
#   source tests/cluster/env.sh
# The munge socket, ports and the slurmdbd address are all read from this slurm.conf.
export HORUS_CLUSTER_DIR="${HORUS_CLUSTER_DIR:-/tmp/horus-cluster}"
export SLURM_CONF="$HORUS_CLUSTER_DIR/etc/slurm.conf"
# Ordinary users (horus-alice, horus-bob): the project's Python and console scripts, linked by up
# into $HORUS_CLUSTER_DIR/bin (root keeps its own PATH).
if [ "$(id -u)" != 0 ]; then
    case ":$PATH:" in *":$HORUS_CLUSTER_DIR/bin:"*) ;; *) export PATH="$HORUS_CLUSTER_DIR/bin:$PATH" ;; esac
fi
if [ ! -f "$SLURM_CONF" ]; then
    echo "horus-cluster: $SLURM_CONF missing; run tests/cluster/up first" >&2
fi
