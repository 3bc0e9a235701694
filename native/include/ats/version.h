/* ats-native version: the one C entry point every build exposes. */
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

/* Version string of the native core, e.g. "0.1.0". Static storage; never free it. */
const char *ats_version(void);

#ifdef __cplusplus
}
#endif
