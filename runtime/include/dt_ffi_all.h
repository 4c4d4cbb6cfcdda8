/* dt_ffi_all.h: every public header, preprocessed with -DDT_FFI into lua/dt/cdef.lua at build time. */
#include "dt_base.h"
#include "dt_tensor.h"
#include "dt_ops.h"
#include "dt_nn.h"
#include "dt_random.h"
#include "dt_optim.h"
#include "dt_io.h"
#include "dt_control.h"
#include "dt_launch.h"
#include "dt_store.h"
#include "dt_comm.h"
#include "dt_tokenizer.h"
#include "dt_cuda.h" /* declared in every build; only CUDA builds define the functions (dt_cuda_build()) */
