/* Control: what a tool may include. */
#include "expseg.h"
#include "trace.h"
