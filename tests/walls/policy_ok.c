/* Control: what policy/ may include. */
#include "expseg.h"
#include "policy.h"
