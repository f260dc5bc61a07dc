/* xferctl output: human tables or JSON (--json) for listings. */
#ifndef XFER_SERVICE_CTL_PRINT_H
#define XFER_SERVICE_CTL_PRINT_H

#include "proto/control.pb-c.h"

#include <stdbool.h>
#include <stdio.h>

void print_peers(FILE *f, const Xctl__PeerList *pl, bool json);
void print_regions(FILE *f, const Xctl__RegionList *rl, bool json);
void print_stats(FILE *f, const Xctl__StatsInfo *si, bool json);
void print_health(FILE *f, const Xctl__HealthInfo *h, bool json);
void print_batch(FILE *f, const Xctl__BatchResult *b, bool json);
/* JSON string literal with escapes. */
void json_str(FILE *f, const char *s);

#endif
