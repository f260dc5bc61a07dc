LIB_SRCS += $(wildcard engine/*.c engine/*/*.c)
# Transports with their own build pieces (test drivers, CUDA objects).
include $(sort $(wildcard engine/*/module.mk))
