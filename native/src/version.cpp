// Version of the native core.
#include "ats/version.h"

const char *ats_version(void) { return "0.1.0"; }
