# libclockstep.so: LD_PRELOAD shim stepping a process's wall clock
# (tests/integration/test_clock_step.sh). Built without the sanitizers: it
# only forwards clock reads.
CLOCKSTEP := $(B)/tests/libclockstep.so
$(CLOCKSTEP): tests/clockstep/clockstep.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -fPIC -shared $< -o $@
all: $(CLOCKSTEP)
