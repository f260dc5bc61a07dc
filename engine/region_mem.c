/*
 * Memory the engine allocates (xfer_region_alloc): a memfd so same-host
 * peers can map it, on huge pages where the host has them, and populated at
 * registration so no transfer pays first-touch faults.
 *
 * Huge pages: MFD_HUGETLB (hugetlbfs, reserved at mmap time, so a host
 * without free huge pages fails the mmap cleanly and we fall back, saying so
 * once per process) for lengths that are a multiple of the huge page size;
 * otherwise plain shmem with MADV_HUGEPAGE (used where shmem THP is set to
 * "advise"). Pre-faulting: MADV_POPULATE_WRITE (Linux 5.14), else one write
 * per page; a large region is populated by several threads at once (the
 * kernel zeroes every page: one thread populated 1 GiB of 4 KiB pages at
 * 1.3 GB/s on the 2-core VM, so a 1 GiB xfer_region_alloc took 0.8 s).
 * XFER_HUGETLB=0 and XFER_REGION_PREFAULT=0 turn either off (for
 * measuring what they save). The memfd is sealed against resizing: the fd
 * goes to clients and peers, none may resize it (nor add seals that would
 * refuse their writable mappings).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mman.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static size_t huge_page_size(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    size_t kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "Hugepagesize: %zu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* Faults every page in now: a first transfer into fresh memory otherwise
 * ran at a third of the speed of one into touched memory. */
static void prefault_range(uint8_t *p, size_t len)
{
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0)
        return;
    long pg = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < len; off += (size_t)pg) /* fresh memfd: zeros */
        __atomic_store_n(&p[off], 0, __ATOMIC_RELAXED);
}

#define PREFAULT_PIECE   (64u << 20) /* at least this much per thread */
#define PREFAULT_THREADS 8

struct prefault_part {
    uint8_t *p;
    size_t len;
};

static void *prefault_main(void *arg)
{
    struct prefault_part *part = arg;
    prefault_range(part->p, part->len);
    return NULL;
}

/* Splits a large region over up to PREFAULT_THREADS threads (pieces aligned
 * to `align`, the page size in use); the caller populates the first piece.
 * A thread that cannot start leaves its piece to the caller. */
static void prefault(uint8_t *p, size_t len, size_t align)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = len / PREFAULT_PIECE;
    if (n > PREFAULT_THREADS)
        n = PREFAULT_THREADS;
    if (ncpu > 0 && n > (size_t)ncpu)
        n = (size_t)ncpu;
    if (n < 2) {
        prefault_range(p, len);
        return;
    }
    size_t piece = (len / n + align - 1) / align * align;
    struct prefault_part part[PREFAULT_THREADS];
    pthread_t tid[PREFAULT_THREADS];
    bool started[PREFAULT_THREADS] = {false};
    for (size_t i = 0; i < n; i++) {
        size_t off = i * piece < len ? i * piece : len;
        part[i] = (struct prefault_part){p + off, len - off < piece ? len - off : piece};
        if (i > 0 && part[i].len)
            started[i] = pthread_create(&tid[i], NULL, prefault_main, &part[i]) == 0;
    }
    prefault_range(part[0].p, part[0].len);
    for (size_t i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else if (part[i].len)
            prefault_range(part[i].p, part[i].len);
    }
}

static int seal(int fd)
{
    return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ? -errno : 0;
}

static int map_fd(int fd, size_t len, void **out)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    *out = p;
    return 0;
}

/* hugetlbfs memfd of len bytes, or -1 (reason in why). */
static int try_hugetlb(const char *name, size_t len, void **out, char *why, size_t why_len)
{
    size_t hp = huge_page_size();
    if (xfer_env_off("XFER_HUGETLB")) {
        snprintf(why, why_len, "XFER_HUGETLB=0");
        return -1;
    }
    if (hp == 0 || len % hp != 0) {
        snprintf(why, why_len, "length not a multiple of the %zu KiB huge page", hp >> 10);
        return -1;
    }
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0 && ftruncate(fd, (off_t)len) < 0)
        err = errno;
    if (fd >= 0 && err == 0)
        err = -seal(fd);
    if (fd >= 0 && err == 0)
        err = -map_fd(fd, len, out);
    if (err == 0)
        return fd;
    snprintf(why, why_len, "%s", strerror(err));
    if (fd >= 0)
        close(fd);
    return -1;
}

int region_mem_alloc(xfer_engine *e, const char *name, size_t len, int *fd_out, void **ptr_out)
{
    char why[128] = "";
    void *p = NULL;
    int fd = len >= (2u << 20) ? try_hugetlb(name, len, &p, why, sizeof(why)) : -1;
    bool huge = fd >= 0;
    if (!huge) {
        static int said; /* one line per process, not per region */
        if (why[0] && !xfer_env_off("XFER_HUGETLB") &&
            !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            xfer_info("region %s: no huge pages (%s): using 4 KiB pages (reserve some with "
                      "vm.nr_hugepages)",
                      name, why);
        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, (off_t)len) < 0 || seal(fd) < 0) {
            xfer_engine_set_error(e, "region %s: memfd of %zu bytes: %s", name, len,
                                  strerror(errno));
            int rc = errno == ENOMEM || errno == ENOSPC ? -XFER_ENOMEM : -XFER_EIO;
            if (fd >= 0)
                close(fd);
            return rc;
        }
        if (map_fd(fd, len, &p) < 0) {
            xfer_engine_set_error(e, "region %s: mmap of %zu bytes failed", name, len);
            close(fd);
            return -XFER_ENOMEM;
        }
        madvise(p, len, MADV_HUGEPAGE); /* shmem THP where set to "advise" */
    }
    if (!xfer_env_off("XFER_REGION_PREFAULT"))
        prefault(p, len, huge ? huge_page_size() : (2u << 20));
    *fd_out = fd;
    *ptr_out = p;
    return 0;
}
