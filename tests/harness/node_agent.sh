#!/bin/sh
# Launch agent for the namespaced test nodes (tests/harness/nodes.py), in place of ssh:
#   node_agent.sh NODE COMMAND...
# runs COMMAND on NODE: in the network namespace named NODE, in a fresh UTS namespace whose
# hostname is NODE. Like ssh, the words of COMMAND are joined and run by a shell, which is
# how OpenMPI (plm_rsh_agent) hands over its remote daemon's command line.
node=$1
shift
exec ip netns exec "$node" unshare --uts sh -c 'hostname "$0" && eval "$1"' "$node" "$*"
