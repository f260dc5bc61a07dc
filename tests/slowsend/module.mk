# libslowsend.so: LD_PRELOAD shim delaying a process's sendmsg calls once the
# program arms it (tests/integration/test_notify.sh). Built without the
# sanitizers: it only forwards sendmsg.
SLOWSEND := $(B)/tests/libslowsend.so
$(SLOWSEND): tests/slowsend/slowsend.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -fPIC -shared $< -o $@ -ldl
all: $(SLOWSEND)
