/* SPDX-License-Identifier: Apache-2.0 */
/* Control, and the wall under base/: its headers compile with base/ alone on the include
 * path, so they include nothing of expseg's layers. */
#include "clock.h"
#include "dec.h"
#include "map.h"
#include "rand.h"
#include "treap.h"
#include "units.h"
