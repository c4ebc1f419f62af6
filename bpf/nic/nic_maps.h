/* Maps of the NIC receive path. */
#ifndef __NIC_MAPS_H
#define __NIC_MAPS_H

#include "nic_structs.h"
#include "nic_icrc.h"
#include "nic_ack.h"

#define BPF_F_MMAPABLE_ (1U << 10)
#define BPF_F_INNER_MAP_ (1U << 12)   /* inner maps may differ in max_entries (MR size) */

BPF_F_TABLE("array", u32, struct mr_chunk, mr_tmpl, 1, BPF_F_MMAPABLE_ | BPF_F_INNER_MAP_);
BPF_HASH_OF_MAPS(mrs, u32, "mr_tmpl", MAX_MRS);     /* rkey -> the MR's memory */
BPF_HASH(mr_infos, u32, struct mr_info, MAX_MRS);  /* rkey -> bounds, access, PD */
BPF_HASH(qps, u32, struct qp_rx, MAX_QPS);          /* local QPN -> receive state */
BPF_PERCPU_ARRAY(rx_counters, u64, RX_NREASONS);
BPF_PERCPU_ARRAY(tx_counters, u64, TX_NCOUNTERS);
BPF_PERCPU_ARRAY(scratch, struct scratch, 1);
BPF_ARRAY(crc_tab, struct crc_tables, 1);            /* filled by the loader */
BPF_PERCPU_ARRAY(icrc_scratch, struct icrc_scratch, 1);

#endif
