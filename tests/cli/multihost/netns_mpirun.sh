#!/usr/bin/env bash
# netns_mpirun.sh - run an MPI program across two emulated "hosts".
#
# Usage: netns_mpirun.sh NP_PER_HOST -- PROGRAM [ARGS...]
#
# Two network namespaces joined by a veth pair stand in for two hosts.
# mpirun runs inside the first namespace with a hostfile naming the two veth
# addresses; the daemon for the second "host" is started through a generated
# plm_rsh agent that enters the second namespace instead of using ssh.
# Only the TCP BTL (plus self) is allowed, bound to the veth subnet, so all
# inter-"host" MPI traffic goes through the veth pair.
#
# Environment:
#   NETNS_MPIRUN_TIMEOUT  seconds before the whole run is killed (default 300);
#                         a timeout exits 124
#   NETNS_MPIRUN_EXPORT   space-separated names of variables to pass to all
#                         ranks (mpirun -x NAME); unset names are skipped
#   NETNS_MPIRUN_ARGS     extra mpirun options (word-split), e.g.
#                         "--display-map --tag-output"
#   NETNS_MPIRUN_STATS    1: print veth byte counters before/after to stderr
#   NETNS_MPIRUN_BTL      BTL list (default self,tcp; self,vader,tcp = shared
#                         memory inside a "host", TCP across, as on real hosts)
#   NETNS_MPIRUN_AGENT_ENV  clean (default: the remote side gets a small
#                         ssh-like environment) or inherit (mpirun's whole env)
#   NETNS_MPIRUN_VERBOSE  1: print the setup, the mpirun line and each agent
#                         invocation to stderr
#
# Exit status: the program's (as mpirun reports it), 124 on timeout,
# 77 (with "skipped: ..." on stderr) when namespaces cannot be created or
# mpirun is missing, 2 on usage errors. Everything created is removed on
# every exit path.
set -u

me=netns_mpirun
usage() { echo "usage: $0 NP_PER_HOST -- PROGRAM [ARGS...]" >&2; exit 2; }
skip() { local m="$*"; m=${m//$'\n'/; }; echo "skipped: $m" >&2; exit 77; }
say() { [ "${NETNS_MPIRUN_VERBOSE:-0}" = 1 ] && echo "$me: $*" >&2; return 0; }

[ $# -ge 3 ] || usage
np_per_host=$1
case $np_per_host in ''|*[!0-9]*|0) usage ;; esac
[ "$2" = "--" ] || usage
shift 2

timeout_s=${NETNS_MPIRUN_TIMEOUT:-300}
case $timeout_s in ''|*[!0-9]*) echo "$me: NETNS_MPIRUN_TIMEOUT must be an integer" >&2; exit 2 ;; esac

# ---- names --------------------------------------------------------------
id=$$
ns1="brigade-$id-h1"
ns2="brigade-$id-h2"
veth1="bgv${id}a"          # interface names are limited to 15 characters
veth2="bgv${id}b"
net="10.213.$(( id % 254 + 1 ))"
ip1="$net.1"
ip2="$net.2"
subnet="$net.0/24"

work=""
child=""
created_ns=()

# ---- teardown (every exit path) ------------------------------------------
kill_ns_procs() {   # kill whatever still runs inside our namespaces
    local ns pids sig
    for sig in TERM KILL; do
        pids=""
        for ns in "${created_ns[@]}"; do
            pids="$pids $(ip netns pids "$ns" 2>/dev/null)"
        done
        pids=$(echo $pids)
        [ -n "$pids" ] || return 0
        say "killing leftover processes ($sig): $pids"
        kill -s "$sig" $pids 2>/dev/null
        [ "$sig" = TERM ] && for _ in 1 2 3 4 5 6 7 8 9 10; do
            sleep 0.2
            pids=""
            for ns in "${created_ns[@]}"; do
                pids="$pids $(ip netns pids "$ns" 2>/dev/null)"
            done
            [ -n "$(echo $pids)" ] || return 0
        done
    done
}

cleanup() {
    local ns
    trap '' INT TERM HUP
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$child" 2>/dev/null || break
            sleep 0.3
        done
        kill -KILL "$child" 2>/dev/null
    fi
    kill_ns_procs
    for ns in "${created_ns[@]}"; do
        ip netns del "$ns" 2>/dev/null   # the veth pair goes with them
    done
    [ -n "$work" ] && rm -rf "$work"
}
trap 'st=$?; cleanup; exit $st' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---- preconditions --------------------------------------------------------
command -v ip >/dev/null 2>&1 || skip "cannot create network namespaces: 'ip' command not found"
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found in PATH"
command -v timeout >/dev/null 2>&1 || skip "'timeout' command not found"
command -v unshare >/dev/null 2>&1 || skip "cannot create network namespaces: 'unshare' command not found"

# ---- namespaces + veth ----------------------------------------------------
err=$(ip netns add "$ns1" 2>&1) || skip "cannot create network namespaces: ${err:-ip netns add failed}"
created_ns+=("$ns1")
err=$(ip netns add "$ns2" 2>&1) || skip "cannot create network namespaces: ${err:-ip netns add failed}"
created_ns+=("$ns2")
err=$(ip netns exec "$ns1" unshare --uts sh -c 'hostname brigade-uts-probe' 2>&1) \
    || skip "cannot create network namespaces: own hostname per namespace (unshare --uts): ${err:-failed}"
err=$(ip link add "$veth1" netns "$ns1" type veth peer name "$veth2" netns "$ns2" 2>&1) \
    || skip "cannot create network namespaces: veth: ${err:-ip link add failed}"
err=$( { ip -n "$ns1" link set lo up &&
         ip -n "$ns2" link set lo up &&
         ip -n "$ns1" addr add "$ip1/24" dev "$veth1" &&
         ip -n "$ns2" addr add "$ip2/24" dev "$veth2" &&
         ip -n "$ns1" link set "$veth1" up &&
         ip -n "$ns2" link set "$veth2" up; } 2>&1) \
    || skip "cannot create network namespaces: configuring veth: ${err:-failed}"
say "namespaces $ns1 ($veth1 $ip1) <-> $ns2 ($veth2 $ip2)"

work=$(mktemp -d /tmp/nsmpi.XXXXXX) || { echo "$me: mktemp failed" >&2; exit 1; }
mkdir -p "$work/h1" "$work/h2"

# ---- hostfile -------------------------------------------------------------
hostfile="$work/hostfile"
printf '%s slots=%s\n%s slots=%s\n' "$ip1" "$np_per_host" "$ip2" "$np_per_host" > "$hostfile"

# ---- agent ----------------------------------------------------------------
# plm_rsh invokes the agent exactly like ssh: "AGENT HOST WORD WORD ...".
# The words are fragments of a shell command line (values are already
# double-quoted by OpenMPI, e.g. -mca orte_hnp_uri "123.0;tcp://..." and the
# first word is " orted" with a leading blank), which ssh would join with
# blanks and hand to the remote shell. We do the same: join with blanks
# ("$*") and run it with sh -c inside the namespace of that address.
# Like ssh, the remote side starts from a small login-like environment
# (env -i + PATH HOME USER LOGNAME SHELL LANG LD_LIBRARY_PATH), so ranks on
# h2 see only what mpirun forwards (-x); NETNS_MPIRUN_AGENT_ENV=inherit
# passes the whole environment instead.
# Each "host" also gets its own UTS namespace with hostname = namespace name:
# with one shared hostname, OpenMPI 4.1.4 (ob1 + tcp) segfaults in
# mca_pml_ob1_recv_frag_callback_match as soon as a host has 2+ ranks.
# And its own TMPDIR, so the session directories of the daemons never mix.
agent="$work/agent.sh"
agent_inherit=0
[ "${NETNS_MPIRUN_AGENT_ENV:-clean}" = inherit ] && agent_inherit=1
{
    echo '#!/bin/sh'
    echo "# generated by netns_mpirun.sh (pid $id)"
    echo "ip1=$ip1 ns1=$ns1 tmp1=$work/h1"
    echo "ip2=$ip2 ns2=$ns2 tmp2=$work/h2"
    echo "verbose=${NETNS_MPIRUN_VERBOSE:-0} inherit=$agent_inherit"
    cat <<'EOF'
host=$1; shift
if [ "$host" = "$ip1" ]; then ns=$ns1; tmp=$tmp1
elif [ "$host" = "$ip2" ]; then ns=$ns2; tmp=$tmp2
else echo "netns_mpirun agent: unknown host '$host'" >&2; exit 255
fi
cmd="$*"
[ "$verbose" = 1 ] && printf 'netns_mpirun agent: host=%s ns=%s cmd=%s\n' "$host" "$ns" "$cmd" >&2
if [ "$inherit" = 1 ]; then
    set -- env TMPDIR="$tmp"
else
    set -- env -i PATH="$PATH" TMPDIR="$tmp"
    [ -n "${HOME+x}" ] && set -- "$@" HOME="$HOME"
    [ -n "${USER+x}" ] && set -- "$@" USER="$USER"
    [ -n "${LOGNAME+x}" ] && set -- "$@" LOGNAME="$LOGNAME"
    [ -n "${SHELL+x}" ] && set -- "$@" SHELL="$SHELL"
    [ -n "${LANG+x}" ] && set -- "$@" LANG="$LANG"
    [ -n "${LD_LIBRARY_PATH+x}" ] && set -- "$@" LD_LIBRARY_PATH="$LD_LIBRARY_PATH"
fi
exec "$@" ip netns exec "$ns" unshare --uts sh -c "hostname $ns || exit 255; $cmd"
EOF
} > "$agent"
chmod 755 "$agent"

# ---- mpirun command ---------------------------------------------------------
btl=${NETNS_MPIRUN_BTL:-self,tcp}
# A batch system's environment (e.g. running inside salloc) would make mpirun
# use its allocation and launcher instead of the hostfile and the agent.
for v in $(compgen -e); do
    case $v in SLURM_*|PBS_*|SGE_*|LSB_*|FLUX_*|PE_HOSTFILE|JOB_ID) unset "$v" ;; esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmd=(mpirun
     --hostfile "$hostfile"
     -np $(( 2 * np_per_host ))
     --oversubscribe --bind-to none
     --mca plm rsh
     --mca plm_rsh_agent "$agent"
     --mca pml ob1
     --mca btl "$btl"
     --mca osc ^ucx
     --mca btl_tcp_if_include "$subnet"
     --mca oob_tcp_if_include "$subnet"
     -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)
for v in ${NETNS_MPIRUN_EXPORT:-}; do
    if [ -n "${!v+set}" ]; then
        cmd+=(-x "$v")
    else
        echo "$me: warning: NETNS_MPIRUN_EXPORT names unset variable '$v', not exported" >&2
    fi
done
# shellcheck disable=SC2206
extra=(${NETNS_MPIRUN_ARGS:-})
cmd+=("${extra[@]}" "$@")

veth_bytes() {  # "tx rx" of veth1 as seen in ns1
    local t r
    t=$(ip netns exec "$ns1" cat "/sys/class/net/$veth1/statistics/tx_bytes" 2>/dev/null)
    r=$(ip netns exec "$ns1" cat "/sys/class/net/$veth1/statistics/rx_bytes" 2>/dev/null)
    echo "${t:-?} ${r:-?}"
}
[ "${NETNS_MPIRUN_STATS:-0}" = 1 ] && before=$(veth_bytes)

say "running (timeout ${timeout_s}s): ip netns exec $ns1 unshare --uts ... ${cmd[*]}"
t_start=$(date +%s.%N)
# In the background so that our INT/TERM traps run at once (cleanup then
# stops timeout, which forwards TERM to mpirun). timeout -k: KILL 10 s later.
TMPDIR="$work/h1" timeout -k 10 "$timeout_s" \
    ip netns exec "$ns1" unshare --uts sh -c 'hostname "$0" || exit 255; exec "$@"' "$ns1" \
    "${cmd[@]}" &
child=$!
wait "$child"
status=$?
child=""
t_end=$(date +%s.%N)

if [ "${NETNS_MPIRUN_STATS:-0}" = 1 ]; then
    after=$(veth_bytes)
    echo "$me: veth $veth1 tx/rx bytes before: $before after: $after" >&2
fi
say "mpirun exited $status after $(awk "BEGIN{printf \"%.2f\", $t_end - $t_start}") s"
# timeout exits 124, or 137 when mpirun needed the KILL: report both as 124
if [ "$timeout_s" -gt 0 ] && { [ $status -eq 124 ] ||
     { [ $status -eq 137 ] && awk "BEGIN{exit !($t_end - $t_start >= $timeout_s)}"; }; }; then
    echo "$me: timed out after ${timeout_s}s" >&2
    status=124
fi
exit $status
