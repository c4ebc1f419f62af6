"""Results of `metaroce perf` in perftest's shapes (ib_write_bw / ib_write_lat tables) and as
JSON: rates in bits per second, latencies in microseconds (`*_us`)."""

from __future__ import annotations

import math

BW_HEAD = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
LAT_HEAD = (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
            "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
LINE = "-" * 95


def percentile(sorted_us: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_us:
        return math.nan
    k = max(0, min(len(sorted_us) - 1, math.ceil(q / 100 * len(sorted_us)) - 1))
    return sorted_us[k]


def bw_result(size: int, iters: int, seconds: float, peak_bps: float) -> dict:
    avg = size * iters * 8 / seconds if seconds > 0 else 0.0
    return {"bytes": size, "iterations": iters, "seconds": round(seconds, 6),
            "bw_avg_bps": round(avg), "bw_peak_bps": round(max(peak_bps, avg)),
            "msg_rate": round(iters / seconds, 1) if seconds > 0 else 0.0}


def lat_result(size: int, samples_us: list[float]) -> dict:
    s = sorted(samples_us)
    n = len(s)
    avg = sum(s) / n
    std = math.sqrt(sum((x - avg) ** 2 for x in s) / n)
    return {"bytes": size, "iterations": n, "lat_min_us": round(s[0], 3),
            "lat_max_us": round(s[-1], 3), "lat_p50_us": round(percentile(s, 50), 3),
            "lat_avg_us": round(avg, 3), "lat_stdev_us": round(std, 3),
            "lat_p99_us": round(percentile(s, 99), 3), "lat_p999_us": round(percentile(s, 99.9), 3),
            "msg_rate": round(n / (sum(s) / 1e6), 1) if sum(s) else 0.0}


def header(test: str, info: dict) -> list[str]:
    name = {"write-bw": "RDMA_Write BW Test", "read-bw": "RDMA_Read BW Test",
            "send-bw": "Send BW Test", "write-lat": "RDMA_Write Latency Test",
            "read-lat": "RDMA_Read Latency Test", "send-lat": "Send Latency Test",
            "atomic-lat": "Atomic FETCH_AND_ADD Latency Test"}[test]
    return [LINE, f"                    {name}",
            f" Dual-port       : OFF          Device         : {info['dev']}",
            f" Number of qps   : {info['qps']}            Transport type : "
            f"{'MetaRoCE' if info['mode'] == 'metaroce' else 'IB (RoCEv2)'}",
            f" Connection type : RC           Using SRQ      : OFF",
            f" Mode            : {info['mode']}     PMTU : {info['mtu']}     XDP: {info['xdp_mode']}"
            f"     Integrity: {info.get('integrity', 'icrc')}",
            f" TX depth        : {info['tx_depth']}           CPUs           : "
            f"{','.join(map(str, info['cpus']))}",
            LINE, BW_HEAD if test.endswith("bw") else LAT_HEAD]


def row(test: str, r: dict) -> str:
    if test.endswith("bw"):
        return (f" {r['bytes']:<10} {r['iterations']:<14} {r['bw_peak_bps'] / 1e9:<18.2f} "
                f"{r['bw_avg_bps'] / 1e9:<20.2f} {r['msg_rate'] / 1e6:<.6f}")
    return (f" {r['bytes']:<7} {r['iterations']:<11} {r['lat_min_us']:<14.2f} "
            f"{r['lat_max_us']:<14.2f} {r['lat_p50_us']:<16.2f} {r['lat_avg_us']:<14.2f} "
            f"{r['lat_stdev_us']:<16.2f} {r['lat_p99_us']:<22.2f} {r['lat_p999_us']:<.2f}")
