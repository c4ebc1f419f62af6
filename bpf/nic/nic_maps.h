/* Maps of the NIC data path. */
#ifndef __NIC_MAPS_H
#define __NIC_MAPS_H

#include "nic_structs.h"
#include "nic_icrc.h"
#include "nic_reply.h"

#define BPF_F_MMAPABLE_ (1U << 10)
#define BPF_F_INNER_MAP_ (1U << 12)   /* inner maps may differ in max_entries (MR size) */

BPF_F_TABLE("array", u32, struct mr_chunk, mr_tmpl, 1, BPF_F_MMAPABLE_ | BPF_F_INNER_MAP_);
BPF_HASH_OF_MAPS(mrs, u32, "mr_tmpl", MAX_MRS);     /* key -> the MR's memory */
BPF_HASH(mr_infos, u32, struct mr_info, MAX_MRS);  /* key -> bounds, access, PD */
BPF_HASH(qps, u32, struct nic_qp, MAX_QPS);         /* local QPN -> QP state */
BPF_HASH(credit, u32, u32, MAX_QPS);               /* local QPN -> credit share in packets (CC-8) */
BPF_HASH(sq_psn, u32, u32, MAX_QPS);                /* local QPN -> next PSN the requester sends */
BPF_HASH(rq, u64, struct recv_wqe, MAX_QPS * 64);   /* (QPN, slot) -> posted receive */
BPF_HASH(rd_slots, u64, struct rd_slot, MAX_QPS * 4);   /* (QPN, slot) -> outstanding READ/ATOMIC */
BPF_HASH(atomic_results, u64, struct atomic_saved, MAX_QPS * 4);  /* (QPN, PSN slot) -> result */
BPF_RINGBUF_OUTPUT(events, 256);                    /* completions and requests for user space */
BPF_PERCPU_ARRAY(rx_counters, u64, RX_NREASONS);
BPF_PERCPU_ARRAY(tx_counters, u64, TX_NCOUNTERS);
BPF_PERCPU_ARRAY(ev_counters, u64, 2);              /* events sent, events lost (ring full) */
BPF_PERCPU_ARRAY(scratch, struct scratch, 1);
BPF_ARRAY(crc_tab, struct crc_tables, 1);            /* filled by the loader */
BPF_PERCPU_ARRAY(icrc_scratch, struct icrc_scratch, 1);

#endif
