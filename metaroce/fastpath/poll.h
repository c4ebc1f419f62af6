/* Busy-polling for latency loops: wait, spinning on the CPU, until a byte of registered memory
 * (written by the kernel's placement) takes a value, and time round trips in nanoseconds. */
#ifndef METAROCE_POLL_H
#define METAROCE_POLL_H

#include <stdint.h>

/* Spin until p[0] == want or timeout_ns passes, yielding the CPU every 32 spins so that the
 * daemon moving our packets can run; returns the ns waited, or -1 on timeout. */
int64_t mr_poll_byte(const volatile uint8_t *p, uint8_t want, uint64_t timeout_ns);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t mr_now_ns(void);

#endif
