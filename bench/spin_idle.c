/*
 * Keeps every CPU out of its idle state without taking time from anyone: one
 * SCHED_IDLE busy loop pinned on each CPU, until SIGTERM/SIGINT (then the
 * loops are killed and reaped before this exits, so none outlives a
 * measurement). A stand-in for a busy server, whose cores seldom sleep: a
 * thread woken there runs at once on a core that did not just leave an idle
 * state (cold caches, an idle exit, on a VM a halted vCPU to resume).
 * bench/bench_all.py measures the message round trips and the raw
 * ping-pong again with it running (docs/perf.md, step 20).
 *
 *   spin_idle [--cpus N]   (default: every CPU this process may run on)
 * Prints "spin_idle: N" once the N loops are forked (each pins and lowers
 * itself right after; one that cannot is reported at exit, status 1).
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

/* A child: pinned to cpu at the lowest policy, spins until killed (or its
 * parent dies without killing it). */
static void spin_on(int cpu)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1)
        _exit(1);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    struct sched_param sp = {0};
    if (sched_setaffinity(0, sizeof(set), &set) != 0 || sched_setscheduler(0, SCHED_IDLE, &sp) != 0)
        _exit(1); /* never spin at normal priority: it would steal the core */
    for (;;)
        __builtin_ia32_pause();
}

int main(int argc, char **argv)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        perror("spin_idle: sched_getaffinity");
        return 1;
    }
    int want = CPU_COUNT(&allowed);
    static const struct option opts[] = {{"cpus", required_argument, 0, 'c'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (o != 'c' || (want = atoi(optarg)) <= 0) {
            fprintf(stderr, "usage: spin_idle [--cpus N]\n");
            return 2;
        }
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigset_t block, wait_mask; /* blocked until sigsuspend: a signal is never missed */
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &wait_mask);
    pid_t kids[CPU_SETSIZE];
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && n < want; cpu++) {
        if (!CPU_ISSET(cpu, &allowed))
            continue;
        pid_t pid = fork();
        if (pid == 0)
            spin_on(cpu);
        if (pid < 0) {
            perror("spin_idle: fork");
            break;
        }
        kids[n++] = pid;
    }
    printf("spin_idle: %d\n", n);
    fflush(stdout);
    while (!stop)
        sigsuspend(&wait_mask);
    for (int k = 0; k < n; k++)
        kill(kids[k], SIGKILL);
    int failed = 0;
    for (int k = 0; k < n; k++) {
        int st = 0;
        while (waitpid(kids[k], &st, 0) < 0 && errno == EINTR)
            ;
        failed += WIFEXITED(st) && WEXITSTATUS(st) != 0; /* could not pin or lower itself */
    }
    if (failed)
        fprintf(stderr, "spin_idle: %d of %d loops could not run pinned at SCHED_IDLE\n", failed,
                n);
    return failed ? 1 : 0;
}
