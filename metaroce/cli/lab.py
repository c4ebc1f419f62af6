"""`metaroce lab`: provision and inspect labs of hosts in network namespaces."""

import click
from click.core import ParameterSource

from ..errors import UsageError
from ..lab import core
from ..lab.impair import DIRECTIONS, Impairment
from ..lab.plan import TOPOLOGIES
from .output import emit_json, json_option, log
from .params import SEED, finite

name_option = click.option("--name", default=None, help="Lab name (default: the only lab up).")


@click.group()
def lab():
    """Labs: hosts and switches in network namespaces joined by veth links."""


@lab.command()
@click.option("--name", default="lab", show_default=True, help="Lab name (prefixes every namespace).")
@click.option("--topology", type=click.Choice(TOPOLOGIES), default="pair", show_default=True)
@click.option("--hosts", type=int, default=None, help="Number of hosts (pair: 2, star: 3, leaf-spine: 4).")
@click.option("--mtu", type=int, default=1500, show_default=True)
@click.option("--rate", default=None, help="Shape every switch egress, e.g. 1gbit, 500mbit.")
@click.option("--ecn-threshold", type=int, default=None,
              help="Mark CE above this many bytes of virtual queue (default 65536 with --rate).")
@click.option("--steer/--no-steer", default=False, show_default=True,
              help="Switches forwarding in XDP hand each frame to the next CPU (a cpumap), so "
                   "a switch and the host behind it work on another CPU than the sender, as "
                   "other hardware would (more throughput, a CPU hand-over of latency, and a "
                   "queue that drops what a faster sender overruns); without it all of a "
                   "frame's path runs on the sending CPU (veth runs XDP where it transmits), "
                   "which also holds a sender back instead of dropping.")
@click.option("--queues", type=int, default=1, show_default=True,
              help="Receive and transmit queues of every veth end. With more than one, a frame "
                   "forwarded in XDP reaches the queue of the CPU that forwarded it, so one "
                   "flow's frames can be received on two CPUs at once (as RSS spreads them on "
                   "a multi-queue NIC); metaroce up steers such devices by QP (--rx-cpus).")
@json_option
def up(name, topology, hosts, mtu, rate, ecn_threshold, steer, queues, as_json):
    """Bring a lab up."""
    rec = core.up(name, topology, hosts, mtu, rate, ecn_threshold, steer=steer, queues=queues)
    view = core.LabView(name)
    doc = view.status(counters=False)
    if as_json:
        emit_json(doc)
        return
    steering = rec.get("steering", "off")
    log(f"lab {name} is up ({rec['xdp_mode']} XDP on every link end, switches forward "
        f"{'in XDP' if rec['forwarding'] == 'xdp' else 'through the stack'}"
        f"{', on the next of ' + str(steering['cpus']) + ' CPUs' if isinstance(steering, dict) and rec['forwarding'] == 'xdp' else ''})")
    _print_nodes(doc)


def _print_nodes(doc):
    for h in doc["hosts"]:
        addrs = [f"{i['name']} {i['ipv4'] or ''} {i['ipv6'] or ''}".strip() for i in h["ifaces"]
                 if i["ipv4"] or i["ipv6"]]
        click.echo(f"{h['name']:<8} {h['role']:<7} {h['netns']:<20} {'; '.join(addrs)}")


@lab.command()
@name_option
@click.option("--all", "all_", is_flag=True, help="Remove every MetaRoCE lab on this machine.")
@json_option
def down(name, all_, as_json):
    """Tear a lab down (also after a crash half-way through `up`)."""
    if all_:
        result = core.down_all()
    else:
        from ..lab import state  # noqa: PLC0415
        result = [core.down(name or state.resolve(None))]
    if as_json:
        emit_json({"removed": result})
    else:
        for r in result:
            log(f"lab {r['name']} removed ({len(r['removed_netns'])} namespaces)")


@lab.command()
@name_option
@json_option
def status(name, as_json):
    """Show nodes, links, counters and impairments."""
    doc = core.LabView(name).status()
    if as_json:
        emit_json(doc)
        return
    click.echo(f"lab {doc['name']}: {doc['topology']}, mtu {doc['mtu']}, XDP {doc['xdp_mode']}, "
               f"forwarding {doc['forwarding']}")
    _print_nodes(doc)
    for l in doc["links"]:
        rate = f"{l['rate'] / 1e9:g} Gbit/s" if l["rate"] else "line rate"
        settings = "; ".join(f"{d}: {describe_impairment(cfg)}" for d, cfg in l["impair"].items())
        click.echo(f"link {l['name']:<16} {rate}" + (f"  impaired ({settings})" if settings else ""))
        for d, c in l["counters"].items():
            extra = ""
            if "tx_packets" in c:
                extra = f" ecn_marked {c['ecn_marked']} queue_drops {c['queue_drops']}"
            imp = c["impair"]
            click.echo(f"  {d}: forwarding {l['forwarding'][d]} | rx {c['rx_packets']} pkts "
                       f"{c['rx_bytes']} B{extra} | impair lost {imp['lost']} "
                       f"dup {imp['duplicated']} reordered {imp['reordered']}")


@lab.command()
@name_option
@click.argument("link")
@click.option("--dir", "direction", type=click.Choice(DIRECTIONS), default="both", show_default=True,
              help="a-b: toward the switch side; b-a: away from it.")
@click.option("--loss", type=finite(0, 1), default=None, help="Drop probability.")
@click.option("--dup", type=finite(0, 1), default=None, help="Duplication probability.")
@click.option("--reorder", type=finite(0, 1), default=None,
              help="Probability that a frame is held back and sent after later ones.")
@click.option("--reorder-depth", type=int, default=1, show_default=True,
              help="How many later frames overtake a held one.")
@click.option("--all-traffic", is_flag=True, help="Impair every IP packet, not only UDP 4791.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the deterministic draws.")
@click.option("--clear", is_flag=True, help="Remove the impairment (of --dir).")
@json_option
def impair(name, link, direction, loss, dup, reorder, reorder_depth, all_traffic, seed, clear, as_json):
    """Impair a LINK (a link name like h1-sw1, or a host name) on its switch side.

    Give at least one of --loss, --dup, --reorder; --clear removes the impairment."""
    given = [p for p in ("loss", "dup", "reorder", "reorder_depth", "all_traffic", "seed")
             if click.get_current_context().get_parameter_source(p) is ParameterSource.COMMANDLINE]
    if clear and given:
        raise UsageError("--clear takes no impairment options (it removes the impairment): "
                         + ", ".join("--" + p.replace("_", "-") for p in given))
    if not clear and loss is None and dup is None and reorder is None:
        raise UsageError("no impairment given: use --loss, --dup or --reorder "
                         "(or --clear to remove the link's impairment)")
    imp = None if clear else Impairment(loss or 0.0, dup or 0.0, reorder or 0.0, reorder_depth,
                                        all_traffic, seed).validate()
    out = core.LabView(name).impair(link, direction, imp)
    if as_json:
        emit_json(out)
        return
    now = "; ".join(f"{d}: {describe_impairment(cfg)}" for d, cfg in out["impair"].items())
    log(f"link {out['link']}: {now or 'no impairment'}")


def describe_impairment(cfg: dict) -> str:
    """One direction's impairment as netem-style words: loss 5% duplicate 1% reorder 2% …"""
    words = [f"{name} {cfg[key] * 100:g}%" for key, name in
             (("loss", "loss"), ("dup", "duplicate"), ("reorder", "reorder")) if cfg.get(key)]
    if cfg.get("reorder"):
        words.append(f"depth {cfg.get('reorder_depth', 1)}")
    if cfg.get("all_traffic"):
        words.append("all traffic")
    return " ".join(words + [f"seed {cfg.get('seed', 0)}"])


@lab.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@name_option
@click.argument("host")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def exec(name, host, cmd):  # noqa: A001 (the verb users expect)
    """Run CMD inside HOST's namespace: metaroce lab exec h1 -- ping 10.0.0.2"""
    argv = list(cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    core.LabView(name).exec(host, argv)
