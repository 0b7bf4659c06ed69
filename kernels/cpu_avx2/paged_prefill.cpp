// structserve_cpu::paged_prefill_attention in the AVX2 library: the kernel of
// ../cpu/paged_prefill.h (both libraries run the same code; see there).

#include "../cpu/paged_prefill.h"

STRUCTSERVE_REGISTER_PAGED_PREFILL()
