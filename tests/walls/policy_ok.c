/* SPDX-License-Identifier: Apache-2.0 */
/* Control: what policy/ may include. */
#include "expseg.h"
#include "dec.h" /* base/ */
#include "policy.h"
