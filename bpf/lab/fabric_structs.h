/* Structs shared by the fabric maps, the programs and (by layout) metaroce/lab/fabric.py. */
#ifndef __FABRIC_STRUCTS_H
#define __FABRIC_STRUCTS_H

#include "fabric_consts.h"

/* Per port, per CPU. */
struct port_stats {
    __u64 rx_packets;
    __u64 rx_bytes;
    __u64 tx_packets;
    __u64 tx_bytes;
    __u64 ecn_marked;      /* CE set on an ECT packet by the virtual queue */
    __u64 ecn_not_ect;     /* over the threshold but not ECN-capable: left unmarked */
};

/* Per slot (port, direction); probabilities are thresholds on a 32-bit uniform draw. */
struct impair_cfg {
    __u32 flags;
    __u32 loss;
    __u32 dup;
    __u32 reorder;
    __u32 reorder_depth;   /* a held frame leaves after this many later frames */
    __u32 pad;
    __u64 seed;
};

/* Per slot, per CPU. */
struct impair_stats {
    __u64 matched;         /* frames the impairment applied to */
    __u64 lost;
    __u64 duplicated;
    __u64 reordered;       /* frames held back and sent after later ones */
    __u64 stash_busy;      /* reorder chosen but the slot's stash was occupied */
};

/* Per slot: the counter behind the deterministic draws (shared by all CPUs, by XDP and tc);
 * the loader sets it back to 0 whenever it sets the slot's impairment. */
struct impair_seq {
    __u64 n;
};

struct stash {
    __u64 state;           /* 64-bit: BCC's BPF target has 64-bit atomics only */
    __u64 countdown;
    __u32 len;
    __u8 ipver;            /* the held frame's shape: only a frame of the same shape carries it */
    __u8 l4proto;
    __u16 pad;
    __u8 data[STASH_MAX];
};

struct scratch {
    __u8 data[STASH_MAX];
};

/* Per port egress: the virtual queue that drives ECN marking. */
struct ecn_cfg {
    __u64 rate_Bps;        /* drain rate in bytes per second; 0 = no marking */
    __u64 threshold;       /* mark CE while the virtual queue is above this many bytes */
};

struct vqueue {
    struct bpf_spin_lock lock;
    __u32 pad;
    __u64 bytes;
    __u64 last_ns;
};

/* Per switch-side port: whether and where its frames may be forwarded in XDP. */
struct port_cfg {
    __u32 domain;          /* the L2 switch (bridge) the port is in; 0 = none: never forwarded */
    __u32 flags;           /* PORT_SHAPED, PORT_STEER */
    __u32 cpus;            /* PORT_STEER: the CPUs 0 .. cpus - 1 frames are handed over to */
};

/* Where a port hands its frames (PORT_STEER): the CPU chosen when its traffic (re)started. */
struct steer_state {
    __u32 cpu;
    __u32 pad;
    __u64 last_ns;         /* the port's last handed-over frame */
};

/* A station (MAC) behind a port of an L2 switch: the bridge's static forwarding entries. */
struct fdb_key {
    __u32 domain;
    __u8 mac[6];
    __u16 pad;
};

#endif
