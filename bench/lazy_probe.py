#!/usr/bin/env python3
"""Does a WRITE to a node whose notification waiter just left wait for the
tcp owner's lazy-EPOLLIN tick? (docs/perf.md, step 8.) Two processes over
tcp; B loops wait_notification(A) then 50 ms without a waiter ("wait"), or
never waits ("sleep"); A notifies, spins a gap, then times one blocking 8 B
WRITE to B, 30 per gap. Usage: XFER_LIB=build/lib/libxfer.so
PYTHONPATH=python python3 bench/lazy_probe.py wait|sleep"""
import multiprocessing as mp, time, statistics, sys
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

def main():
    mode = sys.argv[1]
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
            t_n = time.perf_counter()
            while time.perf_counter() - t_n < gap_us / 1e6: pass
            t0 = time.perf_counter(); e.write(loc, 0, pb, ri, 0, 8).wait(); lat.append((time.perf_counter() - t0) * 1e6)
            time.sleep(0.06)  # B comes back to wait
        lat.sort()
        print(f"{mode:5s} gap {gap_us:6d} us: 8 B WRITE p50 {statistics.median(lat):7.1f} us  p90 {lat[26]:7.1f}  max {lat[-1]:7.1f}", flush=True)
    if mode == "wait": e.notify(pb, "stop")
    else: a_conn.send("stop")
    p.join(10); e.close()
main()
