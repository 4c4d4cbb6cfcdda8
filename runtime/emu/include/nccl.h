/* nccl.h (emulation): the NCCL entry points the backend calls so far (the version query). */
#ifndef DT_EMU_NCCL_H
#define DT_EMU_NCCL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ncclSuccess = 0, ncclInvalidArgument = 4 } ncclResult_t;

/* 0 in the emulation: no NCCL collectives are emulated yet. */
ncclResult_t ncclGetVersion(int *version);

#ifdef __cplusplus
}
#endif
#endif
