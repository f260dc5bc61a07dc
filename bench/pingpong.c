/*
 * Raw TCP ping-pong over loopback: the floor under any request/response
 * transport. A child process echoes; the parent sends `size` bytes, waits for
 * them back, and repeats for `seconds`. Blocking sockets, TCP_NODELAY, one
 * round trip in flight: what a hand-written RPC over TCP costs. --unix: the
 * same over a unix stream socket pair (the floor under a same-host message
 * that crosses a socket, as ipc messages did before their ring). --spin:
 * both sides busy-poll their reads (non-blocking recv in a loop), the
 * floor under a transport that busy-polls (XFER_BUSY_POLL_US).
 *
 *   pingpong [--size BYTES (56 = xfer's 48-byte header + 8 bytes)]
 *            [--seconds S] [--unix] [--spin] [--json]
 * Prints round-trip p50/p99/p99.9 in microseconds and round trips per second.
 */
#include "bench_util.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>

static bool spin;

/* Moves all len bytes through fd: writes them (out), or reads them,
 * sleeping in recv or, with --spin, polling without sleeping. */
static int io_full(int fd, uint8_t *p, size_t len, bool out)
{
    while (len) {
        ssize_t n = out ? write(fd, p, len) : recv(fd, p, len, spin ? MSG_DONTWAIT : 0);
        bool again = errno == EAGAIN || errno == EWOULDBLOCK;
        if (n < 0 && (errno == EINTR || (spin && !out && again)))
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int echo(int lfd, size_t size, bool unix_pair)
{
    int fd = unix_pair ? lfd : accept(lfd, NULL, NULL);
    if (fd < 0)
        return 1;
    if (!unix_pair)
        nodelay(fd);
    uint8_t *buf = malloc(size);
    while (buf && io_full(fd, buf, size, false) == 0 && io_full(fd, buf, size, true) == 0)
        ;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"size", 1, 0, 's'}, {"seconds", 1, 0, 't'},
                                       {"json", 0, 0, 'j'}, {"unix", 0, 0, 'u'},
                                       {"spin", 0, 0, 'p'}, {0, 0, 0, 0}};
    size_t size = 56;
    double seconds = 1;
    bool json = false, unix_pair = false;
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 's')
            size = (size_t)bench_size(optarg);
        else if (c == 't')
            seconds = atof(optarg);
        else if (c == 'j')
            json = true;
        else if (c == 'u')
            unix_pair = true;
        else if (c == 'p')
            spin = true;
        else
            return 2;
    }
    if (size == 0 || size > (64u << 20) || !(seconds > 0) || optind != argc) {
        fprintf(stderr,
                "usage: pingpong [--size BYTES] [--seconds S] [--unix] [--spin] [--json]\n");
        return 2;
    }
    int fd = -1;
    pid_t pid;
    if (unix_pair) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) {
            perror("pingpong: socketpair");
            return 1;
        }
        pid = fork();
        if (pid == 0) {
            close(sv[0]);
            _exit(echo(sv[1], size, true));
        }
        close(sv[1]);
        fd = sv[0];
        if (pid < 0) {
            perror("pingpong: fork");
            return 1;
        }
    } else {
        int lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof(a);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 1) < 0 ||
            getsockname(lfd, (struct sockaddr *)&a, &al) < 0) {
            perror("pingpong: listen");
            return 1;
        }
        pid = fork();
        if (pid == 0) {
            bench_pin(1);
            _exit(echo(lfd, size, false));
        }
        bench_pin(0);
        close(lfd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (pid < 0 || fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
            perror("pingpong: connect");
            return 1;
        }
        nodelay(fd);
    }
    uint8_t *buf = calloc(1, size);
    struct bench_lat lat = {0};
    uint64_t n = 0;
    double t0 = bench_now(), t = t0, warm_end = t0 + 0.1;
    int rc = 0;
    while (t - t0 < seconds + 0.1) {
        double s = bench_now();
        buf[0] = (uint8_t)n;
        if (io_full(fd, buf, size, true) < 0 || io_full(fd, buf, size, false) < 0 ||
            buf[0] != (uint8_t)n) {
            fprintf(stderr, "pingpong: echo lost or wrong\n");
            rc = 1;
            break;
        }
        t = bench_now();
        if (s >= warm_end) {
            bench_lat_add(&lat, t - s);
            n++;
        }
    }
    close(fd);
    waitpid(pid, NULL, 0);
    free(buf);
    if (rc || n == 0) {
        free(lat.v);
        return 1;
    }
    double secs = t - warm_end;
    double p50 = bench_lat_pct(&lat, 50) * 1e6, p99 = bench_lat_pct(&lat, 99) * 1e6,
           p999 = bench_lat_pct(&lat, 99.9) * 1e6;
    if (json)
        printf("{\"size\":%zu,\"round_trips\":%llu,\"rtt_per_s\":%.1f,\"lat_us\":{\"p50\":%.2f,"
               "\"p99\":%.2f,\"p999\":%.2f}}\n",
               size, (unsigned long long)n, (double)n / secs, p50, p99, p999);
    else
        printf("%s%s ping-pong size=%zu: round trip p50 %.1f us p99 %.1f us p99.9 %.1f us, "
               "%.0f round trips/s\n",
               unix_pair ? "unix" : "tcp", spin ? " (spin)" : "", size, p50, p99, p999,
               (double)n / secs);
    free(lat.v);
    return 0;
}
