/* Maps of the lab fabric programs; all are pinned by the loader so later processes can read
 * counters and change the impairment without reloading. */
#ifndef __FABRIC_MAPS_H
#define __FABRIC_MAPS_H

#include "fabric_structs.h"

BPF_PERCPU_ARRAY(port_stats, struct port_stats, MAX_PORTS);
BPF_ARRAY(impair_cfg, struct impair_cfg, MAX_SLOTS);
BPF_PERCPU_ARRAY(impair_stats, struct impair_stats, MAX_SLOTS);
BPF_ARRAY(impair_seq, struct impair_seq, MAX_SLOTS);
BPF_ARRAY(stash, struct stash, MAX_SLOTS);
BPF_PERCPU_ARRAY(scratch, struct scratch, 1);
BPF_ARRAY(ecn_cfg, struct ecn_cfg, MAX_PORTS);
BPF_ARRAY(vqueue, struct vqueue, MAX_PORTS);
BPF_ARRAY(port_cfg, struct port_cfg, MAX_PORTS);
BPF_HASH(fdb, struct fdb_key, __u32, MAX_PORTS);
BPF_DEVMAP(tx_ports, MAX_PORTS);             /* ifindex -> the same switch port, for redirects */
/* CPU -> its queue and the program that sends a handed-over frame on (fabric_cpu_xdp): a
 * switch's forwarding runs on another CPU than the link that brought the frame, as a switch is
 * other hardware than the hosts around it */
BPF_XDP_REDIRECT_MAP("cpumap", struct bpf_cpumap_val, cpus, MAX_CPUS);
BPF_PERCPU_ARRAY(steer_stats, __u64, STEER_NSTATS);
BPF_ARRAY(steer_state, struct steer_state, MAX_PORTS);

#endif
