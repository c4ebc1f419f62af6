/* Sizes, flags and indices of the lab fabric programs (switch ports and host links).
 * Every tunable is an overridable default: the loader passes -DNAME=value. */
#ifndef __FABRIC_CONSTS_H
#define __FABRIC_CONSTS_H

/* Port numbers are interface indices. The lab creates every veth in one scratch namespace, so
 * indices are unique across all of a lab's namespaces, and keeps them below MAX_PORTS. */
#ifndef MAX_PORTS
#define MAX_PORTS 256
#endif

/* Impairment state is kept per port and direction: slot = port * 2 + dir. */
#define DIR_IN  0   /* arriving at the switch-side port (link a -> b) */
#define DIR_OUT 1   /* leaving the switch-side port     (link b -> a) */
#define MAX_SLOTS (MAX_PORTS * 2)

/* impair_cfg.flags */
#define IMPAIR_ENABLED     (1U << 0)
#define IMPAIR_ALL_TRAFFIC (1U << 1)  /* every IP packet, not only UDP to ROCE_UDP_PORT */

#define ROCE_UDP_PORT 4791

/* Largest frame the reorder stash holds (MTU 9000 + Ethernet + VLAN, rounded to chunks). */
#define STASH_CHUNK 512
#define STASH_CHUNKS 19
#define STASH_MAX (STASH_CHUNK * STASH_CHUNKS)

/* stash.state */
#define STASH_EMPTY   0
#define STASH_BUSY    1   /* being filled or released by one CPU */
#define STASH_HELD    2

/* skb->mark values that tell the program a frame is its own clone or release. */
#define MARK_OWN_CLONE 0x4d520001

/* port_cfg.flags */
#define PORT_SHAPED (1U << 0)   /* egress rate-limited (htb) and ECN-marked: frames to it take tc */
#define PORT_STEER  (1U << 1)   /* frames it forwards in XDP leave from another CPU (cpumap) */

/* CPUs a switch may hand frames to (cpumap entries); port_cfg.cpus says how many are used */
#define MAX_CPUS 64

/* A port keeps handing its frames to the CPU it chose until it has been idle this long: a
 * frame never overtakes an earlier one of the same port still queued for another CPU (a sender
 * that moved to another CPU would otherwise reorder its flow at the switch) */
#define STEER_IDLE_NS 1000000ULL

/* steer_stats (per CPU) */
#define STEER_HANDED 0          /* frames this CPU's port program handed to another CPU */
#define STEER_FORWARDED 1       /* frames this CPU's cpumap program sent on to their port */
#define STEER_NSTATS 2

/* The virtual queue forgets idle time beyond this (keeps rate * elapsed within 64 bits). */
#define VQ_MAX_IDLE_NS 1000000000ULL


#endif
