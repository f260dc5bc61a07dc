/*
 * Host memory of the ipc transport: mapping a peer's memfd, and cross-memory
 * attach (process_vm_readv/writev) for regions registered from user pointers.
 */
#include "ipc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY ((unsigned long)-1)
#endif

void *ipc_host_map(int fd, size_t len, bool writable, int *err)
{
    if (len == 0) {
        *err = -XFER_EINVAL;
        return NULL;
    }
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    void *p = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        *err = errno == ENOMEM ? -XFER_ENOMEM : errno == EACCES ? -XFER_EACCES : -XFER_EIO;
        return NULL;
    }
    return p;
}

void ipc_host_unmap(void *p, size_t len)
{
    if (p)
        munmap(p, len);
}

int ipc_memfd_reopen_ro(int fd)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return open(path, O_RDONLY | O_CLOEXEC);
}

void ipc_cma_policy(char *buf, size_t len)
{
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = -1;
    if (f) {
        if (fscanf(f, "%d", &scope) != 1)
            scope = -1;
        fclose(f);
    }
    if (scope < 0)
        snprintf(buf, len, "no Yama LSM; needs same uid or CAP_SYS_PTRACE, dumpable target");
    else
        snprintf(buf, len, "kernel.yama.ptrace_scope=%d%s", scope,
                 scope >= 2 ? " (needs CAP_SYS_PTRACE or is disabled)" : "");
}

pid_t ipc_ptracer_choice(const pid_t *pids, size_t n)
{
    pid_t one = 0;
    for (size_t i = 0; i < n; i++) {
        if (pids[i] <= 0 || (one && pids[i] != one))
            return -1; /* a peer we cannot name, or a second one */
        one = pids[i];
    }
    return one;
}

static struct {
    pthread_mutex_t mu;
    pid_t *pids; /* connected peers, one entry per connection */
    size_t n, cap;
    bool lost;      /* a peer could not be recorded: stay at "any" */
    pid_t declared; /* 0 none, -1 any */
} tracers = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* EINVAL means no Yama, where nothing needs declaring (and nothing can be
 * scoped: the kernel's same-uid rule alone applies). tracers.mu held. */
static void tracers_declare(void)
{
    pid_t choice = tracers.lost ? -1 : ipc_ptracer_choice(tracers.pids, tracers.n);
    if (choice == tracers.declared)
        return;
    unsigned long arg = choice < 0 ? PR_SET_PTRACER_ANY : (unsigned long)choice;
    if (prctl(PR_SET_PTRACER, arg, 0, 0, 0) < 0 && errno != EINVAL)
        xfer_debug("ipc: prctl(PR_SET_PTRACER, %ld): %s", (long)choice, strerror(errno));
    tracers.declared = choice;
}

void ipc_tracer_add(pid_t pid)
{
    pthread_mutex_lock(&tracers.mu);
    if (tracers.n == tracers.cap) {
        size_t cap = tracers.cap ? 2 * tracers.cap : 8;
        pid_t *v = realloc(tracers.pids, cap * sizeof(*v));
        if (v) {
            tracers.pids = v;
            tracers.cap = cap;
        }
    }
    if (tracers.n < tracers.cap)
        tracers.pids[tracers.n++] = pid;
    else
        tracers.lost = true;
    tracers_declare();
    pthread_mutex_unlock(&tracers.mu);
}

void ipc_tracer_remove(pid_t pid)
{
    pthread_mutex_lock(&tracers.mu);
    for (size_t i = 0; i < tracers.n; i++)
        if (tracers.pids[i] == pid) {
            tracers.pids[i] = tracers.pids[--tracers.n];
            break;
        }
    tracers_declare();
    pthread_mutex_unlock(&tracers.mu);
}

static int cma_error(int e, pid_t pid, char *why, size_t why_len)
{
    char pol[128];
    switch (e) {
    case EPERM:
        ipc_cma_policy(pol, sizeof(pol));
        snprintf(why, why_len, "cross-memory attach to pid %d refused by the kernel (EPERM; %s)",
                 (int)pid, pol);
        return -XFER_EACCES;
    case ESRCH:
        snprintf(why, why_len, "cross-memory attach: pid %d is gone", (int)pid);
        return -XFER_ECONN;
    case EFAULT:
        snprintf(why, why_len, "cross-memory attach: address not mapped in pid %d or locally",
                 (int)pid);
        return -XFER_ERANGE;
    case ENOSYS:
        snprintf(why, why_len, "cross-memory attach not available (ENOSYS, seccomp?)");
        return -XFER_ENOTSUP;
    default:
        snprintf(why, why_len, "process_vm_*v(pid %d): %s", (int)pid, strerror(e));
        return -XFER_EIO;
    }
}

/* The kernel may stop short (page boundary faults); continue from there. */
static int cma_copy(pid_t pid, uint64_t raddr, void *local, size_t len, bool write, char *why,
                    size_t why_len)
{
    size_t done = 0;
    while (done < len) {
        struct iovec l = {(char *)local + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(raddr + done), len - done};
        ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return cma_error(errno, pid, why, why_len);
        }
        if (n == 0)
            return cma_error(EFAULT, pid, why, why_len);
        done += (size_t)n;
    }
    return 0;
}

int ipc_cma_read(pid_t pid, uint64_t raddr, void *local, size_t len, char *why, size_t why_len)
{
    return cma_copy(pid, raddr, local, len, false, why, why_len);
}

int ipc_cma_write(pid_t pid, uint64_t raddr, const void *local, size_t len, char *why,
                  size_t why_len)
{
    return cma_copy(pid, raddr, (void *)local, len, true, why, why_len);
}
