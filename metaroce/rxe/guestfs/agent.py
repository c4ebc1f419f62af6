"""The rxe guest's agent (runs inside the guest, Python standard library only).

It serves the host on the virtio-serial port named "metaroce.agent": one JSON request per line,
one JSON reply per line, in order. Requests carry "op":

- ping                                   -> {"ok", "uptime"}
- exec   {argv, input?, timeout?}        -> {"rc", "out", "err"} (a command run to completion)
- spawn  {id, argv}                      -> {"ok"} (a background process with pipes)
- call   {id, line, timeout?}            -> {"line"} (write one line to its stdin, read one
                                            line of its stdout; "line" alone reads only)
- wait   {id, timeout?}                  -> {"rc" (null while running), "out", "err"}
- kill   {id}                            -> {"rc", "out", "err"}
- put    {path, data (base64), mode?}    -> {"ok"}

Errors are {"error": "..."}. When the host disconnects, reads return end-of-file until it
connects again; the agent waits for that.
"""

import base64
import glob
import json
import os
import queue
import subprocess
import sys
import threading
import time

PORT_NAME = "metaroce.agent"
T0 = time.monotonic()


def port_path():
    for name in glob.glob("/sys/class/virtio-ports/*/name"):
        with open(name) as f:
            if f.read().strip() == PORT_NAME:
                return "/dev/" + name.split("/")[-2]
    return None


class Proc:
    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()
        self.err = []
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _out(self):
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)            # end of output

    def _err(self):
        for line in self.p.stderr:
            self.err.append(line)

    def rest(self):
        out = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                out.append(line)
        return "".join(out)


PROCS = {}


def handle(req):
    op = req.get("op")
    if op == "ping":
        return {"ok": True, "uptime": round(time.monotonic() - T0, 3)}
    if op == "exec":
        try:
            r = subprocess.run(req["argv"], input=req.get("input"), capture_output=True,
                               text=True, timeout=req.get("timeout", 60), errors="replace")
        except subprocess.TimeoutExpired as exc:
            return {"rc": None, "out": exc.stdout or "", "err": (exc.stderr or "") + "timeout"}
        except OSError as exc:
            return {"rc": 127, "out": "", "err": str(exc)}
        return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}
    if op == "spawn":
        old = PROCS.pop(req["id"], None)
        if old is not None and old.p.poll() is None:
            old.p.kill()
        try:
            PROCS[req["id"]] = Proc(req["argv"])
        except OSError as exc:
            return {"error": str(exc)}
        return {"ok": True, "pid": PROCS[req["id"]].p.pid}
    if op in ("call", "wait", "kill"):
        pr = PROCS.get(req.get("id"))
        if pr is None:
            return {"error": f"no process {req.get('id')!r}"}
        if op == "call":
            if "line" in req:
                try:
                    pr.p.stdin.write(req["line"].rstrip("\n") + "\n")
                    pr.p.stdin.flush()
                except OSError as exc:
                    return {"error": f"process {req['id']}: {exc}", "err": "".join(pr.err)}
            try:
                line = pr.lines.get(timeout=req.get("timeout", 30))
            except queue.Empty:
                return {"line": None}
            if line is None:
                pr.p.wait()
                return {"error": f"process {req['id']} exited ({pr.p.returncode})",
                        "err": "".join(pr.err)[-4000:]}
            return {"line": line}
        if op == "kill" and pr.p.poll() is None:
            pr.p.kill()
        try:
            rc = pr.p.wait(timeout=req.get("timeout", 0) if op == "wait" else 5)
        except subprocess.TimeoutExpired:
            rc = None
        out = {"rc": rc, "out": pr.rest(), "err": "".join(pr.err)}
        if rc is not None:
            PROCS.pop(req["id"], None)
        return out
    if op == "put":
        os.makedirs(os.path.dirname(req["path"]) or "/", exist_ok=True)
        with open(req["path"], "wb") as f:
            f.write(base64.b64decode(req["data"]))
        os.chmod(req["path"], req.get("mode", 0o644))
        return {"ok": True}
    return {"error": f"unknown op {op!r}"}


def serve(fd, reconnect=True):
    """Answer requests on fd (the virtio port) until end of file; with reconnect (the port),
    end of file means the host is not connected: wait for it instead of returning."""
    buf = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:                   # the host is not connected
            if not reconnect:
                return
            buf = b""
            time.sleep(0.05)
            continue
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
                rep = handle(req)
            except Exception as exc:  # noqa: BLE001 (one bad request never ends the agent)
                req, rep = {}, {"error": f"{type(exc).__name__}: {exc}"}
            rep["seq"] = req.get("seq") if isinstance(req, dict) else None
            data = (json.dumps(rep) + "\n").encode()
            while data:
                try:
                    n = os.write(fd, data)
                except OSError:
                    break
                data = data[n:]


def main():
    for _ in range(600):
        path = port_path()
        if path and os.path.exists(path):
            break
        time.sleep(0.1)
    else:
        print("metaroce agent: no virtio port named " + PORT_NAME, file=sys.stderr)
        return 1
    serve(os.open(path, os.O_RDWR))
    return 0


if __name__ == "__main__":
    sys.exit(main())
