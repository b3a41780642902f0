/* SPDX-License-Identifier: Apache-2.0 */
/* The wall between the tools and vmm/: this must not compile. */
#include "vmm.h"
