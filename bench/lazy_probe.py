#!/usr/bin/env python3
"""Does a WRITE to a node whose notification waiter just left wait for the
tcp owner's lazy-EPOLLIN tick? (docs/perf.md, step 8.) Two processes over
tcp; B loops wait_notification(A) then 50 ms without a waiter ("wait"), or
never waits ("sleep"); A notifies, spins a gap, then times one blocking 8 B
WRITE to B, 30 per gap. "init-poll"/"init-fd", the initiator's side (B
never waits): A ends one WRITE with a blocking wait (its waiter reads the
socket, which may then go lazy), spins a gap, then times a WRITE completed
by spinning on xfer_batch_poll ("init-poll") or by sleeping on the batch's
eventfd ("init-fd"). Usage: XFER_LIB=build/lib/libxfer.so
PYTHONPATH=python python3 bench/lazy_probe.py wait|sleep|init-poll|init-fd"""
import multiprocessing as mp, time, statistics, sys, select
import xfer

def node_b(conn, mode):
    e = xfer.Engine("B", transports="tcp")
    r = e.register("r", 4096)
    conn.send((e.info().to_bytes(), r.info().to_bytes()))
    pa = e.add_peer(xfer.PeerInfo.from_bytes(conn.recv()))
    while True:
        if mode == "wait":
            n = e.wait_notification(pa, timeout=5)
            got = e.poll_notifications()
            if any(x.data == b"stop" for x in got) or n == 0:
                break
            time.sleep(0.05)  # "compute": no waiter for 50 ms
        else:
            time.sleep(0.05)
            if conn.poll():
                break
    e.close()

def spin(gap_us):
    t_n = time.perf_counter()
    while time.perf_counter() - t_n < gap_us / 1e6:
        pass

def timed_write(e, loc, pb, ri, mode):
    """One 8 B WRITE, completed the way the mode says; its time in us."""
    t0 = time.perf_counter()
    t = e.write(loc, 0, pb, ri, 0, 8)
    if mode == "init-poll":
        while not t.done():
            pass
    elif mode == "init-fd":
        while not t.done():
            select.select([t.fileno()], [], [], 1.0)
    else:
        t.wait()
    return (time.perf_counter() - t0) * 1e6

def main():
    mode = sys.argv[1]
    init = mode.startswith("init")
    a_conn, b_conn = mp.Pipe()
    p = mp.Process(target=node_b, args=(b_conn, mode)); p.start()
    binfo, rinfo = a_conn.recv()
    e = xfer.Engine("A", transports="tcp")
    loc = e.register("l", 4096)
    a_conn.send(e.info().to_bytes())
    pb = e.add_peer(xfer.PeerInfo.from_bytes(binfo)); ri = xfer.RegionInfo.from_bytes(rinfo)
    for _ in range(20): e.write(loc, 0, pb, ri, 0, 8).wait()
    for gap_us in (0, 300, 700, 1200, 1800, 3000, 10000):
        lat = []
        for k in range(30):
            if mode == "wait": e.notify(pb, "go")
            if init: e.write(loc, 0, pb, ri, 0, 8).wait()
            spin(gap_us)
            lat.append(timed_write(e, loc, pb, ri, mode))
            time.sleep(0.005 if init else 0.06)  # B comes back to wait
        lat.sort()
        print(f"{mode:9s} gap {gap_us:6d} us: 8 B WRITE p50 {statistics.median(lat):7.1f} us  p90 {lat[26]:7.1f}  max {lat[-1]:7.1f}", flush=True)
    if mode == "wait": e.notify(pb, "stop")
    else: a_conn.send("stop")
    p.join(10); e.close()
main()
