/* nn_generic.h: instantiates the generic kernel file named by DT_NN_GENERIC for real = float and double. */
/* Inside a generic file: `real` is the compute type, RF(name) appends _f32/_f64, RDTYPE is the dtype of
 * real, RIS64 is 0/1, RMATH(fn) picks the libm function (sqrtf or sqrt). No include guard on purpose. */
#define real float
#define RF(name) name##_f32
#define RDTYPE DT_DTYPE_F32
#define RIS64 0
#define RMATH(fn) fn##f
#include DT_NN_GENERIC
#undef real
#undef RF
#undef RDTYPE
#undef RIS64
#undef RMATH

#define real double
#define RF(name) name##_f64
#define RDTYPE DT_DTYPE_F64
#define RIS64 1
#define RMATH(fn) fn
#include DT_NN_GENERIC
#undef real
#undef RF
#undef RDTYPE
#undef RIS64
#undef RMATH
#undef DT_NN_GENERIC
