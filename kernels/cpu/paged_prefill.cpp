// structserve_cpu::paged_prefill_attention in the AVX-512 library: the AVX2 kernel of
// paged_prefill.h (both libraries run the same code; see there).

#include "paged_prefill.h"

STRUCTSERVE_REGISTER_PAGED_PREFILL()
