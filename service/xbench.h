/* The library-level benchmark (service/xbench.c), one implementation for
 * bench/xfer_bench and `xferctl bench`. */
#ifndef XFER_SERVICE_XBENCH_H
#define XFER_SERVICE_XBENCH_H

/* Runs the bench with argv's options (argv[0] is skipped; see xbench.c for
 * them); messages start with "name: ". Forks the target engine's process.
 * Exit code: 0 ok, 1 transfer error or data mismatch, 2 bad arguments. */
int xbench_main(int argc, char **argv, const char *name);

#endif
