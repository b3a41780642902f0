/* The wall between the tools and vmm/: this must not compile. */
#include "vmm.h"
