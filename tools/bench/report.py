#!/usr/bin/env python3
"""Render docs/performance.md from the latest benchmark JSON in tools/bench/results/ (one
command; every table and plot says which command produced it, on which machine, when).

    .venv/bin/python tools/bench/report.py
"""

import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "docs", "performance.md")


def g(x, scale=1.0, fmt="{:.3g}"):
    return fmt.format(x["median"] * scale) + f" ({fmt.format(x['min'] * scale)}–" \
        f"{fmt.format(x['max'] * scale)})" if x else "—"


def vs_tcp(doc) -> list[str]:
    r = doc["results"]
    steer = doc.get("steer", False)      # results from before steering ran without it
    pm = doc.get("pmtu")                 # results from before the fitted MTU have none
    enum_col = "mr_csum_enum_bps" in r
    csum = "MetaRoCE mode, CSUM" + (f", PMTU {pm['metaroce']}" if pm else "")
    heads = ["TCP", "MetaRoCE mode, ICRC" + (f", PMTU {pm['metaroce']}" if pm else ""), csum,
             *([f"MetaRoCE mode, CSUM, PMTU {pm['roce']} (IB enum)"] if enum_col else []),
             "RoCEv2 mode" + (f", PMTU {pm['roce']}" if pm else "")]
    blank = " |" * (len(heads) - 3)          # the cells after the CSUM column

    def row(name, tcp, mr, mr_csum, enum, roce):
        cells = [tcp, mr, mr_csum, *([enum] if enum_col else []), roce]
        return f"| {name} | " + " | ".join(cells) + " |"
    rx = doc.get("rx_cpus", "auto")
    out = [f"### MetaRoCE vs TCP, MTU {doc.get('mtu', 1500)}"
           f"{', switches forwarding on the next CPU (lab up --steer)' if steer else ''}"
           f"{'' if rx == 'auto' else f', receive steering by QP (metaroce up --rx-cpus {rx})'}",
           "", f"`sudo .venv/bin/python tools/bench/vs_tcp.py "
           f"{'--full' if doc['runs'] == 7 else '--quick'} --mtu {doc.get('mtu', 1500)}"
           f"{' --steer' if steer else ''}{'' if rx == 'auto' else ' --rx-cpus ' + rx}`"
           f" — {doc['machine']['host']}, kernel {doc['machine']['kernel']}, "
           f"{doc['machine']['cpus']} CPUs, {doc['date']}; median (min–max) of {doc['runs']} runs "
           f"of {doc['seconds']} s", "",
           "| | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads),
           row("WRITE 1 MiB / iperf3, Gbit/s", g(r['tcp_bps'], 1e-9), g(r['mr_bps'], 1e-9),
               g(r.get('mr_csum_bps'), 1e-9), g(r.get('mr_csum_enum_bps'), 1e-9),
               g(r['roce_bps'], 1e-9)),
           row("CPU-seconds per GiB (whole machine)", g(r['tcp_cpu_s_per_gib']),
               g(r['mr_cpu_s_per_gib']), g(r.get('mr_csum_cpu_s_per_gib')),
               g(r.get('mr_csum_enum_cpu_s_per_gib')), g(r['roce_cpu_s_per_gib'])),
           f"| 64 B half round trip p50, µs | {g(r['tcp_lat_p50_us'])} | "
           + (f"| {g(r['mr_lat_p50_us'])} |{blank}" if "mr_csum_bps" in r else
              f"{g(r['mr_lat_p50_us'])} | | |"),
           f"| 64 B half round trip p99, µs | {g(r['tcp_lat_p99_us'])} | "
           + (f"| {g(r['mr_lat_p99_us'])} |{blank}" if "mr_csum_bps" in r else
              f"{g(r['mr_lat_p99_us'])} | | |"),
           *([f"| share of the busy CPU time on the less busy CPU | "
              f"{g(r['tcp_second_cpu_share'])} | | {g(r['mr_csum_second_cpu_share'])} |{blank}"]
             if "mr_csum_second_cpu_share" in r else []),
           *([f"| TCP on a bare veth pair (no XDP, GSO/GRO): Gbit/s, 64 B p50 µs | "
              f"{g(r['bare_tcp_bps'], 1e-9)}, {g(r['bare_tcp_lat_p50_us'])} |" + " |" * (len(heads) - 1)]
             if "bare_tcp_bps" in r else []),
           "", "Ratios (MetaRoCE / TCP): " + ", ".join(f"{k} **{v}**" for k, v in
                                                     doc["ratios"].items()), ""]
    return out


def nic_rx_cost(doc) -> list[str]:
    names = {"roce_icrc": "RoCEv2 mode, ICRC", "metaroce_icrc": "MetaRoCE mode, ICRC",
             "metaroce_csum": "MetaRoCE mode, CSUM (IPv4/UDP checksums, spec 5.7)"}
    m = doc["machine"]
    out = ["### The XDP receive path per packet, by integrity check", "",
           f"`{doc['command']}` — {m['host']}, kernel {m['kernel']}, {m['cpus']} CPUs, "
           f"{doc['date']}. A WRITE_ONLY of each payload checked and placed into a registered "
           "region by the NIC's XDP program (BPF_PROG_TEST_RUN single runs, the kernel times "
           f"each; median of 200 per run, median of {doc['runs']} runs), and the same with the "
           "ACK/SACK it generates; a pass-through XDP program is the floor.", "",
           "| payload B | pass-through ns | " + " | ".join(f"{names[c]} ns (+ACK)"
                                                       for c in doc["checks"]) + " |",
           "|---" * (2 + len(doc["checks"])) + "|"]
    for r in doc["rows"]:
        out.append(f"| {r['payload_bytes']} | {r['pass_through_ns']:.0f} | " +
                   " | ".join(f"{r[c + '_place_ns']:.0f} ({r[c + '_place_and_ack_ns']:.0f})"
                              for c in doc["checks"]) + " |")
    out += ["", "Least-squares fit of the placement cost over the payload size: " +
            "; ".join(f"{names[c]} {v['ns_per_kib']:.0f} ns per KiB + {v['fixed_ns']:.0f} ns "
                      f"per packet" for c, v in doc["per_kib"].items()) + ".", ""]
    return out


def loss_sweep(doc) -> list[str]:
    impaired = doc.get("impaired", "udp 4791")
    what = ("every IP frame (TCP's too)" if impaired == "all ip" else
            "UDP 4791 only (TCP ran without loss)")
    out = ["### Goodput under random loss", "",
           f"`{doc.get('command', 'sudo .venv/bin/python tools/bench/loss_sweep.py --quick')}` — "
           f"{doc['machine']['host']}, "
           f"kernel {doc['machine']['kernel']}, {doc['date']}; {doc['size']}-byte WRITEs, "
           f"{doc['depth']} in flight, one QP{_at_pmtu(doc)}, median (min–max) of "
           f"{doc['runs']} runs of "
           f"{doc['seconds']} s per point; loss from the lab's XDP impairment on h1's link, both "
           f"ways, on {what}; the switch forwards in XDP at every point (loss alone keeps it "
           "there)", "",
           "| loss | MetaRoCE Gbit/s | RoCEv2 Gbit/s | TCP Gbit/s | MetaRoCE p99 completion, ms "
           "| RoCEv2 p99 completion, ms | app errors MR / RoCE |", "|---|---|---|---|---|---|---|"]
    for p in doc["points"]:
        out.append(f"| {p['loss']:.2%} | {g(p['metaroce']['goodput_bps'], 1e-9)} | "
                   f"{g(p['roce']['goodput_bps'], 1e-9)} | {g(p['tcp']['goodput_bps'], 1e-9)} | "
                   f"{g(p['metaroce'].get('fct_p99_s'), 1e3)} | {g(p['roce'].get('fct_p99_s'), 1e3)} "
                   f"| {p['metaroce']['app_errors']} / {p['roce']['app_errors']} |")
    base = next((p for p in doc["points"] if p["loss"] == 0), None)
    if base:
        keys = ("metaroce", "roce", "tcp")
        out += ["", "Share of each contender's own lossless goodput (medians):", "",
                "| loss | MetaRoCE | RoCEv2 | TCP |", "|---|---|---|---|"]
        for p in doc["points"]:
            if p["loss"]:
                out.append(f"| {p['loss']:.2%} | " + " | ".join(
                    f"{p[k]['goodput_bps']['median'] / base[k]['goodput_bps']['median']:.2f}"
                    for k in keys) + " |")
    out += ["", "![loss sweep](../tools/bench/results/loss_sweep.png)", "",
            "Native XDP on the lab's ports turns the hosts' segmentation offload off, so TCP "
            "sends MTU-sized segments here like RDMA sends packets: the same loss fraction hits "
            "both per packet. TCP is the reference line; compare the two RDMA modes with each "
            "other.", ""]
    return out


def qp_scale(doc) -> list[str]:
    cmd = doc.get("command", "sudo .venv/bin/python tools/bench/qp_scale.py --quick")
    out = ["### Many QPs", "",
           f"`{cmd}` — {doc['machine']['host']}, "
           f"{doc['date']}; MetaRoCE mode{_at_pmtu(doc)}, {doc['msg_bytes']}-byte WRITEs, "
           f"{doc['depth_per_qp']} "
           f"in flight per QP, median of {doc['runs']} runs of {doc['seconds']} s", "",
           "| QPs | goodput Gbit/s (min–max) | vs 1 QP | Jain fairness | daemon RSS KiB per QP "
           "(requester / responder) | kernel QP state bytes per QP (requester / responder) | "
           "kernel map bytes per QP incl. the responder's MR memory |",
           "|---|---|---|---|---|---|---|"]
    one = doc["rows"][0]["goodput_bps"] if doc["rows"] else 0
    for r in doc["rows"]:
        lo, hi = r["goodput_min_max_bps"]
        st = r.get("kernel_state_bytes_per_qp")
        state = f"{st['requester']:.0f} / {st['responder']:.0f}" if st else "—"
        out.append(f"| {r['qps']} | {r['goodput_bps'] / 1e9:.3g} ({lo / 1e9:.3g}–{hi / 1e9:.3g}) "
                   f"| {r['goodput_bps'] / one:.2f} | {r['jain_fairness']:.3f} | "
                   f"{r['requester_rss_kib_per_qp']:.1f} / "
                   f"{r['responder_rss_kib_per_qp']:.1f} | {state} | "
                   f"{r['kernel_map_bytes_per_qp']:.0f} |")
    fixed = doc["rows"][-1].get("state_tables_fixed_bytes") if doc["rows"] else None
    out += ["", "Posting is a write into the QP's send ring in shared memory (no daemon round "
            "trip). The kernel QP state is what the QP's entry in the data path's hash map "
            "costs (fdinfo memlock growth of the hash maps; allocated per entry, "
            "BPF_F_NO_PREALLOC; the next PSN to send is a slot of a fixed array)"
            + (f"; the maps' bucket arrays are a fixed {fixed / 2**20:.1f} MiB for 4096 QPs of "
               "capacity" if fixed else "")
            + ". The last column adds the responder's registered memory for the QPs "
            "(64 KiB chunks), which is the application's buffer, not per-QP overhead; the "
            "responder's RSS per QP is that buffer too (32 KiB per QP here, mapped by its "
            "daemon). The map bytes also hold each QP's receive queue ring (an mmap-able BPF "
            "array the NIC reads receives from: one page for the one-entry receive queue of "
            "this benchmark's QPs) and the daemons' RSS the pages of the send rings they have "
            "touched (memfds: 8 entries of 512 bytes here).", ""]
    return out


def daemon_rtt(doc) -> list[str]:
    r = doc["results"]
    return ["### A control verb's round trip", "",
            f"`sudo .venv/bin/python tools/bench/daemon_rtt.py` — {doc['machine']['host']}, "
            f"{doc['date']}; {doc['requests']} requests, median (min–max) of {doc['runs']} runs",
            "", "| application → daemon request round trip | p50 µs | p99 µs |", "|---|---|---|",
            f"| answered at once | {g(r['p50_us'])} | {g(r['p99_us'])} |", "",
            "What a control verb (PD, MR, CQ and QP create/modify/destroy, connect, query) "
            "costs over the daemon's socket; posting and polling no longer pay it (below).", ""]


def verbs_queues(paths: dict) -> list[str]:
    """Issue 19's numbers: system calls per post, post to wire, the cost of each step, the
    busy-poll trade-off."""
    out = ["### Verbs in shared memory", ""]
    if "post_syscalls" in paths:
        doc = paths["post_syscalls"]
        r = doc["results"]
        out += [where(doc) + ".", "",
                f"System calls of an application per signalled 64-byte RDMA WRITE posted and "
                f"completed one at a time ({doc['posts']} per run, median (min–max) of "
                f"{doc['runs']} runs; counted by a BCC program on the sys_enter raw tracepoint). "
                "Before the rings (issue 19): 3.06 socket system calls per post.", "",
                "| waiting by | socket system calls per post | all system calls per post | "
                "of which waits (select/poll) | doorbells rung per post | post → completion "
                "p50 µs | p99 µs |", "|---|---|---|---|---|---|---|"]
        for mode, label in (("poll", "spinning on CQ.poll"), ("wait", "CQ.wait (channel)")):
            x = r[mode]
            out.append(f"| {label} | {rng(x['socket_syscalls_per_post'])} | "
                       f"{rng(x['syscalls_per_post'])} | {rng(x['wait_syscalls_per_post'])} | "
                       f"{rng(x['doorbells_per_post'])} | {rng(x['post_to_completion_p50_us'])} "
                       f"| {rng(x['post_to_completion_p99_us'])} |")
        out += [""]
    if "post_to_wire" in paths:
        doc = paths["post_to_wire"]
        r = doc["results"]
        out += [where(doc) + ".", "",
                "post_send to the first packet on the wire: one unsignaled 64-byte WRITE at a "
                "time; CLOCK_MONOTONIC before the call against the frame's bpf_ktime_get_ns at "
                "an XDP program on the receiving host (one lab switch hop away); the hop alone "
                "is a frame sent with an AF_PACKET socket. Median (min–max) over "
                f"{doc['runs']} runs of {doc['samples']} samples.", "",
                "| series | p50 µs | p99 µs | of it: the post_send call, p50 µs |",
                "|---|---|---|---|",
                f"| posts 50 µs apart (the daemon polls its rings) | {rng(r['hot_p50_us'])} | "
                f"{rng(r['hot_p99_us'])} | {rng(r['hot_call_p50_us'])} |",
                f"| posts {doc['gap_ms']:g} ms apart (the daemon sleeps: a doorbell) | "
                f"{rng(r['asleep_p50_us'])} | {rng(r['asleep_p99_us'])} | "
                f"{rng(r['asleep_call_p50_us'])} |",
                f"| the hop alone (AF_PACKET, no verbs) | {rng(r['hop_p50_us'])} | "
                f"{rng(r['hop_p99_us'])} | |", ""]
    if "verbs_steps" in paths:
        doc = paths["verbs_steps"]
        out += [where(doc) + ".", "",
                f"Each step alone ({doc['calls']} calls, mean; median (min–max) of "
                f"{doc['runs']} runs):", "", "| step | µs |", "|---|---|"]
        out += [f"| {k} | {rng(v, 1, '{:.2f}')} |" for k, v in doc["results_us"].items()]
        out += [""]
    if "busy_poll" in paths:
        doc = paths["busy_poll"]
        out += [where(doc) + ".", "",
                "The busy-poll bound: an application posts signalled 64-byte WRITEs one at a "
                "time with a think time between them; both daemons of the pair with a fixed "
                "bound (METAROCE_BUSY_POLL_US) or their adaptive one. Median (min–max) of "
                f"{doc['runs']} runs of {doc['posts']} posts; CPU is both daemons' "
                "(/proc/PID/schedstat).", "",
                "| bound µs | think time µs | post → completion p50 µs | p99 µs | doorbells "
                "per post | daemons' CPU µs per post |", "|---|---|---|---|---|---|"]
        for b, by_gap in doc["results"].items():
            for gap, x in by_gap.items():
                out.append(f"| {b} | {gap} | {rng(x['p50_us'])} | {rng(x['p99_us'])} | "
                           f"{rng(x['doorbells_per_post'], 1, '{:.2f}')} | "
                           f"{rng(x['daemon_cpu_us_per_post'])} |")
        out += [""]
    return out


def where(doc) -> str:
    """The command, machine, date and load a result came from."""
    m = doc["machine"]
    ls, le = doc.get("load_start", {}), doc.get("load_end", {})
    others = sorted(set(ls.get("labs_present", [])) | set(le.get("labs_present", [])))
    load = (f"load average {ls['loadavg'][0]:g} at the start, {le['loadavg'][0]:g} at the end"
            if ls and le else "load not recorded")
    if others:
        load += f"; other labs up meanwhile (concurrent tests): {', '.join(others)}"
    return (f"`{doc['command']}` — {m['host']}, kernel {m['kernel']}, {m['cpus']} CPUs"
            f"{' (' + m['cpu_model'] + ')' if m.get('cpu_model') else ''}, {doc['date']}; {load}")


def _at_pmtu(doc) -> str:
    """The path MTU the benchmark connected its QPs at by hand: the CM's pick
    (benchlab.path_mtu), by mode as the run recorded it."""
    p = doc.get("pmtu")
    if not p:
        return " (at the path MTU the CM picks, benchlab.path_mtu)"
    return " (at the path MTU the CM picks: " + ", ".join(
        f"{v:,} bytes in {'MetaRoCE' if k == 'metaroce' else 'RoCEv2'} mode"
        for k, v in p.items()) + ")"


def num(v: float, fmt: str | None = None) -> str:
    """3 significant digits, whole numbers from 1000 up (counts read better that way)."""
    if fmt:
        return fmt.format(v)
    return f"{v:,.0f}".replace(",", " ") if abs(v) >= 1000 else f"{v:.3g}"


def rng(x, scale=1.0, fmt=None) -> str:
    """median (min–max), or the median alone when all runs agree."""
    if not x:
        return "—"
    a, lo, hi = (num(x[k] * scale, fmt) for k in ("median", "min", "max"))
    return a if lo == hi else f"{a} ({lo}–{hi})"


INCAST_LABELS = {"metaroce": "MetaRoCE", "roce": "RoCEv2 (go-back-N)", "tcp": "TCP (iperf3)",
                 "metaroce_credits": "MetaRoCE + credits"}


def _credit_bdp(doc) -> str:
    """The receiver's BDP in packets as its credit manager counted it (its status in the run)."""
    for per in doc.get("raw", {}).values():
        for run in per.get("metaroce_credits", []):
            rc = run.get("receiver_credits") or {}
            if rc.get("bdp_pkts"):
                return (f"here {rc['bdp_pkts']} packets for "
                        f"{rc['link_rate_bps'] / 1e6:g} Mbit/s × {rc['base_rtt_us'] / 1e3:g} ms")
    return "its BDP in packets"


def incast(doc) -> list[str]:
    cr = doc["credits"]
    out = ["### Incast on the lab (real data path)", "", where(doc) + ".", "",
           f"A star lab, every switch egress shaped to {doc['rate_bps'] / 1e6:g} Mbit/s (htb, a "
           f"{doc['queue_limit_frames']}-frame queue) with ECN marking above "
           f"{doc['ecn_threshold_bytes'] // 1024} KiB; N senders, each a lab host with its own "
           f"`metaroce up` daemon, WRITE {doc['msg_bytes'] // 1024} KiB messages{_at_pmtu(doc)} "
           f"({doc['depth_per_qp']} posted per QP, one QP each) to h1 for {doc['seconds']:g} s; "
           f"TCP is one iperf3 stream per sender. Contenders alternate within each of "
           f"{doc['runs']} runs; median (min–max). Drops and CE marks are the bottleneck port's "
           "counters (sw1 → h1), retransmissions the senders' daemons' (TCP: iperf3's), backlog "
           "the htb queue sampled every 100 ms, sRTT the senders' smoothed RTT (MetaRoCE).", ""]
    if cr.get("supported"):
        out += [f"Receiver credits: the receiver's daemon is restarted with `--credits "
                f"--link-rate {cr['link_rate_bps'] / 1e6:g}mbit --credit-rtt-us "
                f"{cr['credit_rtt_us']}` after the other contenders have run (every other "
                "contender ran with `--no-credits`), so that row comes from later in the same "
                "run.", ""]
    else:
        out += [f"Receiver credits: {cr['note']}; no credits row.", ""]
    out += ["| senders | contender | goodput Mbit/s | Jain | drops | CE marks | retransmitted "
            "| deepest backlog KB | sRTT ms | failed QPs (all runs) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for n in doc["senders"]:
        for c in doc["contenders"]:
            p = doc["points"][str(n)][c]
            out.append(f"| {n} | {INCAST_LABELS.get(c, c)} | {rng(p['goodput_bps'], 1e-6)} | "
                       f"{rng(p['jain'], 1, '{:.3f}')} | {rng(p['drops'])} | "
                       f"{rng(p['ecn_marked'])} | {rng(p.get('retransmitted_packets'))} | "
                       f"{rng(p.get('queue_backlog_max_bytes'), 1e-3)} | "
                       f"{rng(p.get('srtt_us'), 1e-3)} | {p['failed_qps_total']} |")
    out += ["", "![incast](../tools/bench/results/incast.png)", "",
            "How to read it. Every daemon runs its congestion control (`metaroce up --cc`, the "
            "default since 2026-12-07; `docs/engine.md` rule 8): a MetaRoCE QP's window is cut "
            "when its SACKs echo CE marks with the RTT above its target, a RoCEv2 QP's rate "
            "(DCQCN) when CNPs arrive. Without credits, MetaRoCE's drops come from the first "
            "round trip: N fresh QPs each start with a whole window (127 packets, CC-1's "
            "line-rate start), more than the 1000-frame queue holds from N = 8 on; after that "
            "the marks hold the queue down and SACK repairs only what was lost, so no QP fails. "
            "With receiver credits a QP that connects beside others starts limited to its share "
            f"of the receiver link's BDP ({_credit_bdp(doc)}) until it sends, "
            "and the active senders keep their shares, so the queue stays a few tens of KB deep "
            "and nothing is dropped. A RoCEv2 QP keeps up to 1024 PSNs in flight, its first "
            "window leaves before the first CNP returns, DCQCN's 55 µs timers restore its rate "
            "within tens of ms on this millisecond RTT, and it goes back N on every loss, "
            "resending what had arrived: goodput collapses and QPs end in retry-exceeded "
            "(failed QPs). TCP (cubic; its frames are not ECN-capable, "
            "`ecn_not_ect`) is the reference line: the htb shaper lets TCP's GSO aggregates "
            "through about 5–15 % above the nominal rate (205–230 Mbit/s on the wire in a "
            "16-sender check), so TCP can show more goodput than the link's rate. Everything "
            "runs on one shared 2-vCPU VM: the senders' daemons, the receiver's and the switch "
            "share two CPUs.",
            ""]
    return out


SIM_LABELS = {"metaroce_credits": "MetaRoCE + credits", "metaroce": "MetaRoCE (window CC)",
              "roce": "RoCEv2 (go-back-N, DCQCN)"}


def sim_scale(doc) -> list[str]:
    f, qs = doc["fabric"], doc["qps_setup"]
    m = doc["machine"]
    out = ["### At scale — SIMULATION (metaroce.sim)", "",
           f"`{doc['command']}` — {m['host']}, {doc['date']}; the simulated network is what "
           f"counts, not this machine (the run took {doc['wall_s']:g} s of wall time on it). "
           f"**Simulated**: {doc['what']}. Runs are seeds {doc['seeds'][0]}–{doc['seeds'][-1]}, "
           "every contender on every seed; median (min–max) over seeds.", "",
           f"Fabric: {f['rate_bps'] / 1e9:g} Gbit/s links of {f['link_delay_ns'] / 1e3:g} µs, "
           f"MTU {f['mtu']}, switch egress buffer {f['buffer_bytes'] // 1024} KiB (tail drop), "
           f"ECN above {f['ecn_bytes'] // 1024} KiB, PSN window {f['psn_window']}, RTO_min "
           f"{f['rto_min_ns'] / 1e3:g} µs, RoCEv2 local ACK timeout "
           f"{f['compat_timeout_ns'] / 1e6:.0f} ms; no PFC, so RoCEv2 here is RoCE on a lossy "
           "fabric.", "",
           f"**Many QPs on one link.** {qs['senders']} sender hosts, QPs spread evenly, "
           f"long-lived {qs['msg_bytes'] // 1024} KiB WRITE streams ({qs['depth']} posted per QP) "
           f"into one receiver's link, starts spread over {qs['stagger_s'] * 1e3:g} ms, measured "
           f"after {qs['warmup_after_starts_s'] * 1e3:g} ms more over a window of "
           f"{qs['pkts_per_qp_in_window']} MTU packets per QP at line rate. Starved = QPs that "
           "delivered nothing in the window; drops and RTO expiries over the whole run.", "",
           "| QPs | switch buffer | contender | aggregate Gbit/s | Jain (per QP) | starved QPs "
           "| min / fair share | drops | deepest queue KiB | RTO expiries |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for p in doc["qps"]:
        out.append(f"| {p['qps']} | {p['buffer']} | {SIM_LABELS[p['contender']]} | "
                   f"{rng(p['aggregate_bps'], 1e-9)} | {rng(p['jain'], 1, '{:.3f}')} | "
                   f"{rng(p['starved_qps'])} | {rng(p['min_over_fair'], 1, '{:.2f}')} | "
                   f"{rng(p['drops'])} | {rng(p['max_queue_bytes'], 1 / 1024, '{:.0f}')} | "
                   f"{rng(p['timeouts'])} |")
    inc = doc["incast_setup"]
    out += ["", f"**Incast.** N senders each write {inc['size_kib'] // 1024} MiB "
            f"({inc['msg_kib']} KiB WRITEs) to one receiver at the same instant "
            "(`metaroce.sim.scenarios.run_incast`). Jain over per-flow throughput (bytes / its "
            "completion time); p99 completion is empty when a flow did not finish within the "
            "simulation's 2 s.", "",
            "| senders | contender | goodput Gbit/s | Jain | drops | deepest queue KiB | "
            "retransmissions | RTO expiries | p99 completion ms | unfinished flows |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for p in doc["incast"]:
        unfinished = p["senders"] - p["completed_flows"]["min"]
        out.append(f"| {p['senders']} | {SIM_LABELS[p['contender']]} | "
                   f"{rng(p['goodput_bps'], 1e-9)} | {rng(p['jain_fairness'], 1, '{:.3f}')} | "
                   f"{rng(p['drops'])} | {rng(p['max_queue_bytes'], 1 / 1024, '{:.0f}')} | "
                   f"{rng(p['retransmissions'])} | {rng(p['timeouts'])} | "
                   f"{rng(p['fct_p99_s'], 1e3)} | {unfinished} (worst seed) |")
    fs = doc["failure_setup"]
    out += ["", f"**A failing link.** Leaf-spine, {fs['spines']} spines, "
            f"{fs['host_bps'] / 1e9:g} Gbit/s hosts, {fs['fabric_bps'] / 1e9:g} Gbit/s spine "
            f"links; one QP writes {fs['size_bytes'] >> 20} MiB between the leaves. At "
            f"{fs['fail_at_s'] * 1e6:g} µs the link from leaf1 to the spine the RoCEv2 flow "
            "hashes to fails both ways and stays down (routing does not converge: a black "
            f"hole). MetaRoCE sprays over {fs['entropies']} source ports, so that link is one of "
            "its paths too. Recovery = failure until the delivered rate is back to 90 % of the "
            "rate before × 3/4.", "",
            "| link fails | contender | recovery µs | goodput Gbit/s | application errors (all "
            "seeds) | RTO expiries | path evictions | unfinished (all seeds) |",
            "|---|---|---|---|---|---|---|---|"]
    for p in doc["failure"]:
        raw = [r for r in doc["raw"]["sim_failure"]
               if r["contender"] == p["contender"] and r["fail"] == p["fail"]]
        out.append(f"| {'yes' if p['fail'] else 'no'} | {SIM_LABELS[p['contender']]} | "
                   f"{rng(p['recovery_s'], 1e6) if p['fail'] else '—'} | "
                   f"{rng(p['goodput_bps'], 1e-9)} | {sum(r['app_errors'] for r in raw)} | "
                   f"{rng(p['timeouts'])} | {rng(p['path_evictions'])} | "
                   f"{sum(1 - r['completed_flows'] for r in raw)} |")
    out += ["", "![sim_scale](../tools/bench/results/sim_scale.png)", "",
            "How to read it: with more QPs than the switch buffer holds packets (1024 × 4 KiB "
            "against 1 MiB), a window of one packet per QP is already too much: every "
            "contender keeps dropping, and a QP that loses its whole first window waits for an "
            "RTO that, with no RTT sample yet, is the local ACK timeout; credits cannot go below "
            "one packet per sender (the documented limit in `docs/engine.md`). With a buffer "
            "that holds a packet per QP, credits make 1024 QPs share the link evenly. RoCEv2's "
            "go-back-N without PFC collapses under incast drops; its one path is black-holed by "
            "the failure and the QP ends in retry-exceeded, while MetaRoCE evicts the dead path "
            "and keeps going.", ""]
    return out


def allreduce(doc, name: str = "allreduce") -> list[str]:
    runs = doc.get("runs", 1)
    out = [f"### Allreduce: MetaRoCE collectives vs Gloo (TCP), MTU {doc.get('mtu', 1500)}", "",
           f"`{doc['command']}` — {doc.get('date', '')}; "
           f"{doc['hosts']} lab hosts (star); bus bandwidth as nccl-tests reports it, median "
           f"(min–max) of {runs} runs (the contenders alternate within each); MetaRoCE's "
           "algorithm per size (ring, or tree below 256 KiB with 3+ hosts), once with the "
           "daemons' default ICRC and once with `metaroce up --integrity csum` on every host "
           "(its connections negotiate the UDP checksum, spec 5.7: TCP's own check); "
           "sent/volume: the QP byte counters against what the algorithm must move", "",
           "| bytes | algorithm | MetaRoCE (ICRC) busbw Gbit/s | MetaRoCE (CSUM) busbw Gbit/s | "
           "Gloo busbw Gbit/s | ICRC / Gloo | CSUM / Gloo | MetaRoCE (CSUM) µs | Gloo µs | "
           "sent/volume |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        out.append(f"| {r['bytes']:,} | {r['algorithm']} | "
                   f"{rng(r['metaroce_busbw_gbps'], fmt='{:.3f}')} | "
                   f"{rng(r['metaroce_csum_busbw_gbps'], fmt='{:.3f}')} | "
                   f"{rng(r['gloo_busbw_gbps'], fmt='{:.3f}')} | "
                   f"**{(r['ratio'] or 0):.2f}** | **{(r['ratio_csum'] or 0):.2f}** | "
                   f"{rng(r['metaroce_csum_us'], fmt='{:.0f}')} | "
                   f"{rng(r['gloo_us'], fmt='{:.0f}')} | "
                   f"{r['metaroce_sent_per_iter'] / max(1, r['ring_volume']):.3f} |")
    out += ["", f"![allreduce](../tools/bench/results/{name}.png)", ""]
    return out


MP_LABELS = {"metaroce_4paths": "MetaRoCE, 4 paths", "metaroce_1path": "MetaRoCE, 1 path",
             "roce": "RoCEv2 (one fixed port, go-back-N)", "tcp_1stream": "TCP, 1 stream",
             "tcp_4streams": "TCP, 4 streams"}


def multipath(doc) -> list[str]:
    out = ["### Multipath on a leaf-spine lab (real data path)", "", where(doc) + ".", "",
           f"h1 (under leaf1) sends to h4 (under leaf2) across two spines; both directions of "
           f"every leaf-spine link are shaped to {doc['rate_bps'] / 1e6:g} Mbit/s, so one path "
           f"carries at most that and both spines twice it; the routers hash flows onto spines "
           f"by UDP/TCP ports (kernel ECMP). RDMA contenders WRITE {doc['size'] // 1024} KiB "
           f"messages, {doc['depth']} in flight on one QP, for {doc['seconds']:g} s; TCP is "
           f"iperf3. In the failure runs leaf1's link to spine 1 is set down "
           f"{doc['fail_at_s']:.2g} s in (its reverse direction dies too: leaf2 and spine 1 keep "
           "sending into it). Recovery = the longest gap between completions after the failure "
           "(TCP: consecutive 100 ms iperf3 intervals below 10 % of the usual). "
           f"{doc['runs']} runs, contenders alternating; median (min–max).", "",
           "| contender | goodput, both spines Mbit/s | goodput with the failure Mbit/s | "
           "after the failure Mbit/s | recovery s | path evictions | error completions "
           "(all runs) |", "|---|---|---|---|---|---|---|"]
    for n, label in MP_LABELS.items():
        s, f = doc["steady"][n], doc["failure"][n]
        out.append(f"| {label} | {rng(s['goodput_bps'], 1e-6)} | {rng(f['goodput_bps'], 1e-6)} "
                   f"| {rng(f.get('goodput_after_bps'), 1e-6)} | {rng(f.get('recovery_s'), 1, '{:.3f}')} "
                   f"| {rng(f.get('path_evictions'))} | {f['app_errors']} |")
    used = [u for u in doc.get("spines_used", []) if u["contender"] == "metaroce_4paths"]
    both = sum(1 for u in used if min(u["spine1_pkts"], u["spine2_pkts"]) >
               0.2 * (u["spine1_pkts"] + u["spine2_pkts"]))
    out += ["", "![multipath](../tools/bench/results/multipath.png)", "",
            f"How to read it. Four source ports spread a MetaRoCE QP over both spines in {both} "
            f"of {len(used)} steady runs (four random ports all hash onto one spine 1 time in 8; "
            "an early eviction can also land every path on one spine, as nothing balances the "
            "choice of a new port yet); a single port, like a single TCP stream, is capped at "
            "one spine link. When a spine link dies, a MetaRoCE path that hashed onto it loses "
            "packets, is declared lost by the per-path rule (SACK-5) or times out, and is "
            "evicted to a fresh port (MP-5): no error completion, goodput continues on the "
            "surviving spine. RoCEv2's one fixed port cannot move: if it hashed onto the dead "
            "link, the QP ends in retry-exceeded errors. TCP survives with its own RTO backoff "
            "(one stream stalls for seconds when its flow hashed onto the dead link).", ""]
    return out


def lab_path(doc) -> list[str]:
    out = ["### The lab's own path", "",
           "iperf3 between the two hosts of a `pair` lab (no MetaRoCE daemon: the lab's host-port "
           "programs on both ends), one TCP stream and one unlimited UDP stream of MTU-sized "
           "datagrams, client on CPU 0 and server on CPU 1; median (min–max) Gbit/s of each "
           "variant's runs. `xdp`: the switch redirects between its ports in XDP; `stack`: the "
           "Linux bridge and tc (as on an impaired link), alternated with `xdp` on the same lab. "
           "UDP: the rate sent, the share of it the lab delivered to the receiving host (its "
           "host-end counter), and what iperf3's server read (the rest its socket dropped).", "",
           "| variant | MTU | XDP | switch forwards | TCP | UDP sent | delivered by the lab % "
           "| UDP read | read loss % |", "|---|---|---|---|---|---|---|---|---|"]
    for label, v in doc["variants"].items():
        for r in v["results"]:
            out.append(f"| {label} | {r['mtu']} | {r['xdp_mode']} | {r['forwarding']} | "
                       f"{g(r['tcp_bps'], 1e-9)} | {g(r['udp_sent_bps'], 1e-9)} | "
                       f"{g(r.get('udp_lab_delivered_percent'), 1, '{:.1f}')} | "
                       f"{g(r['udp_bps'], 1e-9)} | {g(r['udp_lost_percent'], 1, '{:.1f}')} |")
    out.append("")
    for label, v in doc["variants"].items():
        out.append(f"- {label}: `{v['command']}` — {v['machine']['host']}, kernel "
                   f"{v['machine']['kernel']}, {v['date']}; {v['runs']} runs of {v['seconds']} s; "
                   f"load average {v['load_start']['loadavg'][0]} at the start, "
                   f"{v['load_end']['loadavg'][0]} at the end; other labs present: "
                   f"{len(v['load_start']['labs_present'])}")
    return out + [""]


def bpf_build(doc) -> list[str]:
    names = {"nic": "NIC program (bpf/nic)", "fabric": "lab fabric (bpf/lab)",
             "metaroce_up": "`metaroce up` on a lab host"}
    out = ["### BPF build cache", "", where(doc) + ".", "",
           f"Each of {doc['runs']} runs uses a fresh temporary cache: the first build compiles "
           "with BCC/clang and records the entry, the second loads it (maps recreated, "
           "instructions loaded with libbpf; the kernel verifier runs either way). Median "
           "(min–max) seconds.", "",
           "| what | compiled s | from the cache s |", "|---|---|---|"]
    for k, r in doc["results"].items():
        out.append(f"| {names.get(k, k)} | {rng(r['compiled'], 1, '{:.2f}')} | "
                   f"{rng(r['cache'], 1, '{:.2f}')} |")
    return out + [""]


def engine_cost(doc) -> list[str]:
    r, p = doc["results"], doc["params"]
    c, cc = r["c_engine"], r["c_engine_cc"]
    out = ["### The requester per event: the C engine the wire runs", "", where(doc) + ".", "",
           f"One MetaRoCE QP, {p['depth']} × {p['msg_pkts']}-packet WRITEs posted, MTU "
           f"{p['mtu']}, window {p['window']} PSNs, {p['loss_ppm'] / 1e4:g} % of first "
           f"transmissions lost, a SACK per {p['ack_every']} packets and per AckReq (BPF-free, "
           "synthetic; the time inside the engine's calls only), with a fixed window (`metaroce "
           "up --no-cc`) and with the window CC the wire runs by default since 2026-12-07. "
           "Median (min–max) ns.", "",
           "| | C engine | C engine + CC |", "|---|---|---|"]
    for m, label in (("ns_per_packet", "per packet sent"), ("ns_per_event", "per event"),
                     ("ns_per_sack_event", "per SACK with holes")):
        out.append(f"| {label} | {rng(c[m], 1, '{:.0f}')} | {rng(cc[m], 1, '{:.0f}')} |")
    out.append(f"| packets / events / retransmissions | {c['descriptors']} / {c['events']} / "
               f"{c['retransmissions']} | {cc['descriptors']} / {cc['events']} / "
               f"{cc['retransmissions']} |")
    return out + [""]


def main() -> int:
    lines = ["# Performance", "",
             "Generated by `tools/bench/report.py` from `tools/bench/results/*.json`; rerun the "
             "commands shown to refresh. Machine: a shared 2-vCPU VM; absolute numbers are noisy, "
             "ratios from one run are what to read. Where the time goes is in "
             "`docs/architecture.md`.", ""]
    for path in sorted(glob.glob(os.path.join(HERE, "results", "vs_tcp_mtu*.json"))):
        lines += vs_tcp(json.load(open(path)))
    path = os.path.join(HERE, "results", "loss_sweep.json")
    if os.path.exists(path):
        lines += loss_sweep(json.load(open(path)))
    path = os.path.join(HERE, "results", "qp_scale.json")
    if os.path.exists(path):
        lines += qp_scale(json.load(open(path)))
    path = os.path.join(HERE, "results", "lab_path.json")
    if os.path.exists(path):
        lines += lab_path(json.load(open(path)))
    path = os.path.join(HERE, "results", "nic_rx_cost.json")
    if os.path.exists(path):
        lines += nic_rx_cost(json.load(open(path)))
    path = os.path.join(HERE, "results", "bpf_build.json")
    if os.path.exists(path):
        lines += bpf_build(json.load(open(path)))
    found = {}
    for name in ("post_syscalls", "post_to_wire", "verbs_steps", "busy_poll"):
        path = os.path.join(HERE, "results", f"{name}.json")
        if os.path.exists(path):
            found[name] = json.load(open(path))
    if found:
        lines += verbs_queues(found)
    path = os.path.join(HERE, "results", "daemon_rtt.json")
    if os.path.exists(path):
        lines += daemon_rtt(json.load(open(path)))
    path = os.path.join(HERE, "results", "incast.json")
    if os.path.exists(path):
        lines += incast(json.load(open(path)))
    path = os.path.join(HERE, "results", "multipath.json")
    if os.path.exists(path):
        lines += multipath(json.load(open(path)))
    for name in ("allreduce", "allreduce_mtu9000"):
        path = os.path.join(HERE, "results", f"{name}.json")
        if os.path.exists(path):
            lines += allreduce(json.load(open(path)), name)
    path = os.path.join(HERE, "results", "sim_scale.json")
    if os.path.exists(path):
        lines += sim_scale(json.load(open(path)))
    path = os.path.join(HERE, "results", "engine_cost.json")
    if os.path.exists(path):
        lines += engine_cost(json.load(open(path)))
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
