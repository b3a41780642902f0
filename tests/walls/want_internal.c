/* The wall between policy/ and pools/: this must not compile. */
#include "internal.h"
