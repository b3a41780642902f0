/* SPDX-License-Identifier: Apache-2.0 */
/* The wall above base/: with base/'s include path alone this must not compile. */
#include "expseg.h"
