# pid_freeze PID: SIGSTOP, then wait (5 s at most) until every thread of
# PID has stopped: kill() returns before they all have. Used by core.sh's
# core_freeze and by service tests.
pid_freeze() {
    kill -STOP "$1" || return 1
    local deadline=$((SECONDS + 5)) t running
    while ((SECONDS < deadline)); do
        running=0
        for t in /proc/"$1"/task/*/stat; do
            [[ $(sed 's/.*) //' "$t" 2>/dev/null | cut -d' ' -f1) == T ]] || running=1
        done
        ((running)) || return 0
        sleep 0.01
    done
    return 1
}
