/* Forwarding between the ports of one L2 switch in XDP (a redirect through the tx_ports devmap)
 * instead of through the Linux bridge and the tc programs: only for frames whose path needs
 * nothing from the stack. The bridge stays for the rest (broadcast, unknown stations, impaired
 * or shaped ports), with the same static forwarding entries. */
#ifndef __FABRIC_FWD_H
#define __FABRIC_FWD_H

#include "fabric_helpers.h"

/* Whether a port direction needs the tc programs: an impairment is set on it (dup and reorder
 * live in tc; the direction keeps one path for all its frames), or its stash holds a frame that
 * only later frames through tc release. */
static __always_inline int needs_tc(const struct impair_cfg *cfg, const struct stash *s)
{
    return !cfg || !s || (cfg->flags & IMPAIR_ENABLED) || s->state != STASH_EMPTY;
}

/* The egress port may take a redirected frame from a port of domain `domain`. */
static __always_inline int fast_egress(const struct port_cfg *out, __u32 domain)
{
    return out && out->domain == domain && !(out->flags & PORT_SHAPED);
}

#endif
