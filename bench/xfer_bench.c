/* xfer_bench: the library-level benchmark (bench/xbench.c; the same code
 * runs as `xferctl bench`). */
#include "xbench.h"

int main(int argc, char **argv)
{
    return xbench_main(argc, argv, "xfer_bench");
}
