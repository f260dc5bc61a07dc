/*
 * xfer error codes — the leaf public header.
 *
 * Every layer (kernels/, proto/, engine/, registry/, node/, service/) reports
 * failures as 0 or a negative XFER_E* code; this header holds the codes, their
 * text and the export marker, and includes nothing of xfer's own, so the
 * layers below the engine can use the codes without including engine/xfer.h.
 */
#ifndef XFER_ERR_H
#define XFER_ERR_H

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a function of the public API of libxfer: the library is built with
 * -fvisibility=hidden, so only what carries this is exported. */
#ifndef XFER_API
#define XFER_API __attribute__((visibility("default")))
#endif

/* ---- errors ------------------------------------------------------------ */
enum xfer_err {
    XFER_OK = 0,
    XFER_EINVAL = 1,  /* bad argument */
    XFER_ENOMEM,      /* out of memory */
    XFER_ENOENT,      /* unknown node, region or item */
    XFER_EACCES,      /* access mode forbids the operation */
    XFER_ERANGE,      /* offset/length outside the region */
    XFER_ESTALE,      /* generation or incarnation no longer current */
    XFER_ETIMEDOUT,   /* deadline passed */
    XFER_ECANCELED,   /* cancelled by the caller */
    XFER_ECONN,       /* connection failed or lost */
    XFER_EPROTO,      /* malformed or unexpected message */
    XFER_EAUTH,       /* handshake authentication failed */
    XFER_EIO,         /* local I/O or device error */
    XFER_ENOTSUP,     /* operation or transport not supported here */
    XFER_EINPROGRESS, /* not finished yet */
    XFER_ENODEV,      /* no such device (e.g. no CUDA device) */
    XFER_EEXIST,      /* name already in use */
    XFER_EBUSY,       /* resource in use */
    XFER_EMISMATCH,   /* layouts of the two sides disagree */
    XFER_ENOSPC,      /* a fixed capacity is exhausted */
    XFER_EUNAVAIL,    /* service (e.g. Redis) unreachable */
    XFER_ETRUNC,      /* message longer than the posted receive buffer */
    XFER_ERR_MAX
};

/* Static string for a code; accepts the negative or positive form. */
XFER_API const char *xfer_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif /* XFER_ERR_H */
