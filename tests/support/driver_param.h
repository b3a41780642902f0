/* SPDX-License-Identifier: Apache-2.0 */
/* driver_param.h: the parameter of the suites instantiated per driver and configuration
 * ("host:capacity=256M", "expandable_segments:True"), printed as that text: GoogleTest
 * would otherwise print the struct's bytes, which `ctest -N` shows and which change from
 * one build to the next (tests/readable_names.cmake fails on them). */
#ifndef EXPSEG_DRIVER_PARAM_H
#define EXPSEG_DRIVER_PARAM_H

#include <ostream>

struct DriverParam {
  const char *driver;
  const char *config;
};

inline void PrintTo(const DriverParam &p, std::ostream *os) { *os << p.driver << " " << p.config; }

#endif
