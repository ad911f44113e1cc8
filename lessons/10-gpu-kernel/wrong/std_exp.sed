# expect: rounded differently
# e^x from the C library instead of kvlab::exp_f32. Every libm (and the GPU's expf) rounds its
# own way, so the weights move by an ulp here and there.
s|^#include "../gpu/kernels.h"|#include <cmath>\
#define exp_f32(x) std::exp(x)  // the mistake, in every e^x of the kernel below\
&|
