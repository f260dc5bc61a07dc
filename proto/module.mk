# protobuf-c messages, generated at build time by protoc-c from proto/*.proto.
PROTOS += $(wildcard proto/*.proto)
GEN_SRCS += $(patsubst proto/%.proto,$(B)/gen/proto/%.pb-c.c,$(wildcard proto/*.proto))
LIB_SRCS += $(wildcard proto/*.c)

$(B)/gen/proto/%.pb-c.c $(B)/gen/proto/%.pb-c.h: proto/%.proto
	@mkdir -p $(B)/gen
	protoc-c --c_out=$(B)/gen $<

# Generated code is not ours to warn about.
$(B)/gen/proto/%.pb-c.o: $(B)/gen/proto/%.pb-c.c
	$(CC) $(CPPFLAGS) $(filter-out -Werror -MMD -MP,$(CFLAGS)) -c $< -o $@
