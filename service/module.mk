# service/: xferd (one node: engine + registry publisher + control server)
# and xferctl (the CLI). Everything but the two mains goes into libxfer.a.
PROGS += xferd:service/xferd_main.c xferctl:service/xferctl_main.c
LIB_SRCS += $(filter-out service/xferd_main.c service/xferctl_main.c,$(wildcard service/*.c))
