LIB_SRCS += $(wildcard engine/*.c engine/*/*.c)
