/* SPDX-License-Identifier: Apache-2.0 */
/* The wall between policy/ and pools/: this must not compile. */
#include "internal.h"
