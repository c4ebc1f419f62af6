"""A responder application in its own process (so a test can freeze it): registers a region
and a QP on a device, prints its attributes as one JSON line, connects to the attributes it
reads from stdin, then answers "hash" with the SHA-256 of the region and "exit" by leaving."""

import hashlib
import json
import sys

from verbs_util import End

from metaroce.verbs import Context


def main() -> None:
    dev, netns, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = Context(dev, netns)
    end = End(ctx, size)
    print(json.dumps({**end.qp.attrs, "rkey": end.mr.rkey, "addr": end.mr.addr,
                      "length": end.mr.length}), flush=True)
    peer = json.loads(sys.stdin.readline())
    end.qp.connect(peer)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "hash":
            print(hashlib.sha256(end.mr.buf).hexdigest(), flush=True)
        elif line.strip() == "exit":
            break
    ctx.close()


if __name__ == "__main__":
    main()
