/* SPDX-License-Identifier: Apache-2.0 */
/* Control: what a tool may include. */
#include "expseg.h"
#include "trace.h"
