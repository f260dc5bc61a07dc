# Node layer: the embeddable node (engine + registry by name: publish,
# resolve, named batches, KV pools). Between service/ and registry/+engine/.
CPPFLAGS += -Inode
LIB_SRCS += $(wildcard node/*.c)
