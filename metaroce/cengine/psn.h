/* 24-bit PSN arithmetic (PSN-1): modulo 2^24, compared within a 2^23 window. */
#ifndef METAROCE_MRE_PSN_H
#define METAROCE_MRE_PSN_H

#include <stdint.h>

#define PSN_MASK 0xFFFFFFu
#define PSN_HALF 0x800000u

static inline uint32_t psn_add(uint32_t p, int64_t n)
{
    return (uint32_t)((int64_t)p + n) & PSN_MASK;
}

/* a - b, sign-extended from bit 23: positive when a is after b */
static inline int32_t psn_diff(uint32_t a, uint32_t b)
{
    uint32_t d = (a - b) & PSN_MASK;
    return d >= PSN_HALF ? (int32_t)d - (int32_t)(1u << 24) : (int32_t)d;
}

/* forward distance from b to a, in [0, 2^24) */
static inline uint32_t psn_dist(uint32_t a, uint32_t b)
{
    return (a - b) & PSN_MASK;
}

/* lo <= x < hi on the PSN circle */
static inline int psn_between(uint32_t lo, uint32_t x, uint32_t hi)
{
    return psn_dist(x, lo) < psn_dist(hi, lo);
}

#endif
