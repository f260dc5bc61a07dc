# N "hosts" as network namespaces joined by veth pairs to one bridge in the
# root namespace. The bridge has an address too, so a server started in the
# root namespace (Redis) and bound to $NETNS_GW is reachable from every host.
# Source this file, then:
#   netns_available            0 when we may create namespaces (root + ip netns)
#   netns_up N                 hosts 1..N; sets NETNS_GW, NETNS_IP[1..N]
#   netns_run I CMD...         runs CMD inside host I
#   netns_down                 removes everything (idempotent; call from a trap)
# Names carry the shell's pid so parallel runs do not collide; interface names
# stay within the kernel's 15 characters.

NETNS_TAG="xs$$"
NETNS_N=0
NETNS_IP=()
NETNS_GW=
NETNS_UP=0

netns_available() {
    [[ $(id -u) == 0 ]] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1
}

_netns_name() { echo "${NETNS_TAG}h$1"; }

netns_up() {
    local n=$1 i ns veth
    # A /24 picked at random inside 10.0.0.0/8 (second and third octets).
    local net="10.$((RANDOM % 200 + 40)).$((RANDOM % 250))"
    NETNS_GW="$net.254"
    NETNS_UP=1
    ip link add "${NETNS_TAG}br" type bridge || return 1
    ip addr add "$NETNS_GW/24" dev "${NETNS_TAG}br" || return 1
    ip link set "${NETNS_TAG}br" up || return 1
    for ((i = 1; i <= n; i++)); do
        ns=$(_netns_name "$i")
        veth="${NETNS_TAG}v$i"
        ip netns add "$ns" || return 1
        NETNS_N=$i
        ip link add "$veth" type veth peer name eth0 netns "$ns" || return 1
        ip link set "$veth" master "${NETNS_TAG}br" up || return 1
        NETNS_IP[i]="$net.$i"
        ip -n "$ns" addr add "${NETNS_IP[i]}/24" dev eth0 || return 1
        ip -n "$ns" link set eth0 up || return 1
        ip -n "$ns" link set lo up || return 1
    done
}

netns_run() {
    local i=$1; shift
    ip netns exec "$(_netns_name "$i")" "$@"
}

netns_down() {
    ((NETNS_UP)) || return 0
    local i
    for ((i = 1; i <= NETNS_N; i++)); do
        ip link del "${NETNS_TAG}v$i" 2>/dev/null
        ip netns del "$(_netns_name "$i")" 2>/dev/null
    done
    ip link del "${NETNS_TAG}br" 2>/dev/null
    NETNS_UP=0 NETNS_N=0
    return 0
}
