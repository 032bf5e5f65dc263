#!/usr/bin/env bash
# The main job across two hosts over TCP: two network namespaces on this machine, joined by
# a veth pair, each a host with its own address. mpirun starts in the first; its launch
# agent (this script, called as `two-hosts.sh agent [options] HOST COMMAND...`) starts
# Open MPI's daemon on the other host with `ip netns exec`. The run's metrics must equal
# those of the same run with 2 ranks as threads. Everything is torn down at exit.
#
# With `--overlap-report` it then runs scripts/overlap-report.sh over the two hosts: the
# exposed communication per step with and without overlap, where the wire is TCP. WICK_MCA
# adds options to that mpirun (`--mca btl_tcp_progress_thread 1`: Open MPI's TCP progress
# thread, which moves a started call's bytes while the rank computes).
#
# usage: scripts/two-hosts.sh MPI_WICK [--overlap-report]
#   (a release `wick` built with --features mpi; run as root, from the repository's root)
set -euo pipefail

ns_a=wick-host-a ns_b=wick-host-b
addr_a=10.77.0.1 addr_b=10.77.0.2 subnet=10.77.0.0/24

if [ "${1:-}" = agent ]; then
  # Open MPI calls the agent like ssh: options first, then the host, then the command.
  shift
  while [ "$#" -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
  host=$1
  shift
  case "$host" in
    "$addr_a") ns=$ns_a ;;
    "$addr_b") ns=$ns_b ;;
    *) echo "two-hosts agent: unknown host '$host'" >&2; exit 1 ;;
  esac
  exec ip netns exec "$ns" sh -c "$*"
fi

wick=$(realpath "$1")
me=$(realpath "$0")
tmp=$(mktemp -d)
teardown() {
  ip netns del "$ns_a" 2> /dev/null || true
  ip netns del "$ns_b" 2> /dev/null || true
  rm -rf "$tmp"
}
trap teardown EXIT
teardown
mkdir -p "$tmp"

echo "== two hosts: $ns_a ($addr_a) and $ns_b ($addr_b), joined by a veth pair"
ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add wick-va type veth peer name wick-vb
ip link set wick-va netns "$ns_a"
ip link set wick-vb netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev wick-va
ip -n "$ns_b" addr add "$addr_b/24" dev wick-vb
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set wick-va up
ip -n "$ns_b" link set wick-vb up

echo "== the main job, one rank on each host, over TCP"
cd "$tmp"
common=(fit --max-steps 20 --no-progress --save-every 20 --val-every 10)
ip netns exec "$ns_a" mpirun --allow-run-as-root -np 2 --host "$addr_a:1,$addr_b:1" \
  --mca plm_rsh_agent "$me agent" \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
  -x PATH \
  sh -c 'echo "rank $OMPI_COMM_WORLD_RANK runs on $(ip -brief addr show | grep -o "10\.77\.0\.[0-9]*")" >&2; exec "$0" "$@"' \
  "$wick" "${common[@]}" --log-dir hosts --checkpoint-dir hosts-ck | grep -v '^ *[0-9]* |\|^-*$\|^ *# |'
"$wick" "${common[@]}" --devices 2 --log-dir threads --checkpoint-dir threads-ck > /dev/null
echo "checkpoint written by the two hosts: $(ls hosts-ck/step-00000020 | tr '\n' ' ')"
# The deterministic columns (step, epoch, losses, lr, skipped steps); the last three are
# wall-clock times.
cmp <(cut -d, -f1-6 hosts/char-gpt/metrics.csv) <(cut -d, -f1-6 threads/char-gpt/metrics.csv)
echo "metrics.csv of the two-host run equals that of 2 ranks as threads (deterministic columns, $(($(wc -l < hosts/char-gpt/metrics.csv) - 1)) steps)"
echo "two-hosts: passed"

if [ "${2:-}" = --overlap-report ]; then
  # Open MPI takes the launch agent as one word.
  printf '#!/bin/sh\nexec "%s" agent "$@"\n' "$me" > "$tmp/agent"
  chmod +x "$tmp/agent"
  cd - > /dev/null
  LAUNCH="ip netns exec $ns_a mpirun --allow-run-as-root -np 2 --host $addr_a:1,$addr_b:1 \
--mca plm_rsh_agent $tmp/agent --mca btl tcp,self --mca btl_tcp_if_include $subnet \
--mca oob_tcp_if_include $subnet ${WICK_MCA:-}" scripts/overlap-report.sh "$wick"
fi
