/* Maps of the NIC data path. */
#ifndef __NIC_MAPS_H
#define __NIC_MAPS_H

#include "nic_structs.h"
#include "nic_icrc.h"
#include "nic_csum.h"
#include "nic_reply.h"

#define BPF_F_MMAPABLE_ (1U << 10)
#define BPF_F_INNER_MAP_ (1U << 12)   /* inner maps may differ in max_entries (MR size) */

BPF_F_TABLE("array", u32, struct mr_chunk, mr_tmpl, 1, BPF_F_MMAPABLE_ | BPF_F_INNER_MAP_);
BPF_HASH_OF_MAPS(mrs, u32, "mr_tmpl", MAX_MRS);     /* key -> the MR's memory */
/* Per-MR and per-QP state is allocated when an entry is created (BPF_F_NO_PREALLOC), not for
 * the whole capacity at load: a QP costs its entries (its state, its next PSN, and one entry per
 * posted receive / outstanding READ or atomic while they exist), about 450 bytes for an idle or
 * WRITE-only QP, instead of ~8 KB of preallocated slots per QP of capacity. The XDP program only
 * looks entries up, deletes a consumed receive and saves atomic results (bpf_mem_alloc). */
#define BPF_F_NO_PREALLOC_ (1U << 0)
BPF_F_TABLE("hash", u32, struct mr_info, mr_infos, MAX_MRS, BPF_F_NO_PREALLOC_);  /* key -> bounds, access, PD */
BPF_F_TABLE("hash", u32, struct nic_qp, qps, MAX_QPS, BPF_F_NO_PREALLOC_);  /* local QPN -> QP state */
BPF_F_TABLE("hash", u32, u32, credit, MAX_QPS, BPF_F_NO_PREALLOC_);  /* local QPN -> credit share in packets (CC-8) */
/* A QP's next PSN to send, at its sq_slot: written by the daemon with a plain store (mmap-able;
 * an array's elements are 8-byte aligned, so each is a u64) on every post's path, read by
 * ACK/SACK handling (RESP-12: no ACK beyond it) */
BPF_F_TABLE("array", u32, u64, sq_psns, MAX_QPS, BPF_F_MMAPABLE_);
/* Each QP's receive queue is a ring its owner writes (bpf/nic/nic_vq.h): an mmap-able array
 * of MR_VQ_HDR_SLOTS + entries slots, found by QPN; the program reads WQEs from it in place. */
BPF_F_TABLE("array", u32, struct mr_rq_slot, rq_tmpl, MR_VQ_HDR_SLOTS + RQ_DEPTH,
            BPF_F_MMAPABLE_ | BPF_F_INNER_MAP_);
BPF_HASH_OF_MAPS(rqs, u32, "rq_tmpl", MAX_QPS);     /* local QPN -> its receive queue ring */
BPF_F_TABLE("hash", u64, struct rd_slot, rd_slots, MAX_QPS * 4, BPF_F_NO_PREALLOC_);  /* (QPN, slot) -> outstanding READ/ATOMIC */
BPF_F_TABLE("hash", u64, struct atomic_saved, atomic_results, MAX_QPS * 4, BPF_F_NO_PREALLOC_);  /* (QPN, PSN slot) -> result */
BPF_RINGBUF_OUTPUT(events, 256);                    /* completions and requests for user space */
/* 1 while the data path thread sleeps on the event ring, 0 while it polls it: written by the
 * daemon (mmap-able), read by emit(), which wakes the thread only when it sleeps */
BPF_F_TABLE("array", u32, u32, ev_sleep, 1, BPF_F_MMAPABLE_);
BPF_PERCPU_ARRAY(rx_counters, u64, RX_NREASONS);
BPF_PERCPU_ARRAY(tx_counters, u64, TX_NCOUNTERS);
BPF_PERCPU_ARRAY(port_counters, u64, PORT_NCOUNTERS);  /* frames and bytes in and out (port) */
BPF_PERCPU_ARRAY(ev_counters, u64, 2);              /* events sent, events lost (ring full) */
BPF_PERCPU_ARRAY(scratch, struct scratch, 1);
BPF_ARRAY(crc_tab, struct crc_tables, 1);            /* filled by the loader */
BPF_PERCPU_ARRAY(icrc_scratch, struct icrc_scratch, 1);
BPF_PERCPU_ARRAY(csum_scratch, struct csum_scratch, 1);
/* Receive steering (nic_steer, nic_rx_cpu): every frame of a QP is handed to the one CPU the
 * daemon chose for the QP, so the QP's state is only ever touched by that CPU */
BPF_F_TABLE("hash", u32, u32, rx_qp_cpu, MAX_QPS + 1, BPF_F_NO_PREALLOC_);  /* local QPN -> CPU */
BPF_XDP_REDIRECT_MAP("cpumap", struct bpf_cpumap_val, rx_cpus, MAX_CPUS);  /* CPU -> nic_rx_cpu */
BPF_DEVMAP(tx_port, 1);              /* the device itself: where nic_rx_cpu's replies leave */
/* The receive path's second stage (STAGE_ACT: nic_rx_2, or nic_rx_cpu_2 behind the steering),
 * tail-called once the first has checked the frame */
BPF_PROG_ARRAY(nic_stages, 1);

#endif
