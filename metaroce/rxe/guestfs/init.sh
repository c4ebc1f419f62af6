#!/bin/sh
# PID 1 of the rxe guest: mount, load virtio and rdma_rxe, configure eth0 from the kernel command
# line (mr.ip=ADDR/PLEN mr.mtu=N mr.neigh=IP@MAC,...), create rxe0 on eth0, then serve the host's
# agent on the virtio-serial port "metaroce.agent" (restarted if it ever exits).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /run /tmp
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
IP= MTU=1500 NEIGH=
for w in $(cat /proc/cmdline); do
    case $w in
        mr.ip=*) IP=${w#mr.ip=} ;;
        mr.mtu=*) MTU=${w#mr.mtu=} ;;
        mr.neigh=*) NEIGH=${w#mr.neigh=} ;;
    esac
done
for m in virtio_pci virtio_net virtio_console crc32_generic rdma_rxe ib_uverbs rdma_ucm; do
    modprobe "$m" || echo "metaroce-guest: modprobe $m failed"
done
ip link set lo up
ip link set eth0 mtu "$MTU" up
[ -n "$IP" ] && ip addr add "$IP" dev eth0
for n in $(echo "$NEIGH" | tr , ' '); do
    ip neigh replace "${n%@*}" lladdr "${n#*@}" dev eth0 nud permanent
done
if rdma link add rxe0 type rxe netdev eth0; then
    echo ready > /run/metaroce-guest.status
else
    echo "failed: rdma link add rxe0 type rxe netdev eth0" > /run/metaroce-guest.status
fi
echo "metaroce-guest: $(cat /run/metaroce-guest.status)"
while true; do
    python3 /opt/metaroce/agent.py
    echo "metaroce-guest: agent exited ($?), restarting"
    sleep 1
done
