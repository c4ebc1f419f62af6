/* Forwarding between the ports of one L2 switch in XDP (a redirect through the tx_ports devmap)
 * instead of through the Linux bridge and the tc programs: only for frames whose path needs
 * nothing from the stack. Loss needs nothing from it: the XDP programs draw it in both
 * directions. The bridge stays for the rest (broadcast, unknown stations, ports duplicating,
 * reordering or shaped), with the same static forwarding entries. */
#ifndef __FABRIC_FWD_H
#define __FABRIC_FWD_H

#include "fabric_helpers.h"

/* Whether a port direction needs the tc programs: duplication or reordering is set on it (they
 * live in tc; the direction then keeps one path for all its frames, RoCE or not), or its stash
 * holds a frame that only later frames through tc release. A loss-only impairment does not:
 * arriving frames lose their draw in the port's XDP program, leaving ones in forward(). */
static __always_inline int needs_tc(const struct impair_cfg *cfg, const struct stash *s)
{
    return !cfg || !s || ((cfg->flags & IMPAIR_ENABLED) && (cfg->dup | cfg->reorder)) ||
           s->state != STASH_EMPTY;
}

/* The egress port may take a redirected frame from a port of domain `domain`. */
static __always_inline int fast_egress(const struct port_cfg *out, __u32 domain)
{
    return out && out->domain == domain && !(out->flags & PORT_SHAPED);
}

#endif
