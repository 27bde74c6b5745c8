#!/usr/bin/env python3
"""What distlock's scripts cost Redis per operation, apart from the network and the client.

Sends pipelined EVALSHA calls (`redis-cli --pipe`) to a redis-server of your own and reads, from INFO
commandstats and the server's /proc/<pid>/stat, the time it spent in EVALSHA and its CPU time, per operation:

    python3 bench/lua_cost.py PORT spread N CYCLES      # BATCH_SPREAD (a cluster node's call), sharded variant
    python3 bench/lua_cost.py PORT coalesced N CYCLES   # the cluster bound's scripts (bench/src/coalesced.rs)
    python3 bench/lua_cost.py PORT lone 1 CYCLES        # ACQUIRE + RELEASE, one lock, as one server runs them
    python3 bench/lua_cost.py PORT fenced 1 CYCLES      # the least fenced cycle (bench/src/floor.rs)

A cycle is one call acquiring N locks (each free: FREED by the last cycle) and one releasing them. The server is
FLUSHALLed first: never point this at a server you did not start. LUADIR=<dir> runs edited copies of
runtime/src/backend/redis/lua (for ablations). `--resp` prints the commands instead of sending them (for
feeding a redis-server run under callgrind; take the difference of two cycle counts, as lone_cycles does).

The scripts are composed here as scripts.rs composes them (`-- #include`, the call-number frame, SPUBLISH for
the sharded variant); if those rules change, change them here too. Numbers: docs/performance.md.
"""

import hashlib
import os
import subprocess
import sys

LUA = os.environ.get("LUADIR", os.path.join(os.path.dirname(__file__), "../runtime/src/backend/redis/lua"))
# scripts.rs CALL_FRAME, PUBLISH and SPUBLISH.
CALL_FRAME = "local call = table.remove(ARGV)\nlocal reply = (function()\n{body}end)()\nreturn {call, reply}\n"
# bench/src/coalesced.rs and bench/src/floor.rs.
COALESCED_ACQUIRE = (
    "local n = tonumber(ARGV[1]) local t = redis.call('time') local now = t[1] .. t[2] "
    "local out = {} for i = 1, n do local R = ARGV[i + 1] local v = redis.call('get', R) "
    "redis.call('set', R, ARGV[n + i + 1] .. ':' .. now .. ':' .. now .. ':7:bench', 'px', '10000') out[i] = now end "
    "return out"
)
COALESCED_RELEASE = (
    "local n = tonumber(ARGV[1]) local out = {} for i = 1, n do local R = ARGV[i + 1] "
    "local v = redis.call('get', R) out[i] = 0 "
    "if v and string.find(v, ARGV[n + i + 1], 1, true) == 1 then "
    "redis.call('setrange', R, '0', '================================') out[i] = 1 end end return out"
)
FENCED_ACQUIRE = (
    "local v = redis.call('get', KEYS[1]) local t = redis.call('time') "
    "redis.call('set', KEYS[1], ARGV[1] .. ':' .. t[1] .. t[2], 'px', ARGV[2]) return 1"
)
FENCED_RELEASE = (
    "local v = redis.call('get', KEYS[1]) "
    "if v and string.find(v, ARGV[1], 1, true) == 1 then redis.call('set', KEYS[1], 'freed', 'keepttl') return 1 end "
    "return 0"
)
HOLDER = "9:host:1234"


def compose(name):
    out = []
    for line in open(os.path.join(LUA, name + ".lua")).read().splitlines():
        included = line.strip()
        if included.startswith("-- #include"):
            out.extend(compose(n) for n in included[len("-- #include"):].split())
        else:
            out.append(line + "\n")
    return "".join(out)


def sharded(name):
    framed = CALL_FRAME.replace("{body}", compose(name), 1)
    return framed.replace("redis.call('publish', ", "redis.call('spublish', ")


def sha(source):
    return hashlib.sha1(source.encode()).hexdigest()


def resp(*args):
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        arg = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def commands(mode, n, cycles):
    """The calls, and the operations they make."""
    out, tokens = [], lambda c: ["%016x%016x" % (c, i) for i in range(n)]
    if mode == "spread":
        source, records, call = sharded("batch_spread"), ["dl:%d" % i for i in range(n)], 0
        out.append(resp("SCRIPT", "LOAD", source))
        for c in range(cycles):
            t = tokens(c)
            # The first acquire in full ('a': token, ttl, holder), the rest repeat it ('b': token alone).
            out.append(resp("EVALSHA", sha(source), 1, records[0], "a" + "b" * (n - 1), *records,
                            t[0], 10000, HOLDER, *t[1:], call + 1))
            released = [arg for token in t for arg in (token, "1")]  # 'r': token, the grant's fence
            out.append(resp("EVALSHA", sha(source), 1, records[0], "r" * n, *records, *released, call + 2))
            call += 2
    elif mode == "coalesced":
        records = ["co:%d" % i for i in range(n)]
        out += [resp("SCRIPT", "LOAD", COALESCED_ACQUIRE), resp("SCRIPT", "LOAD", COALESCED_RELEASE)]
        for c in range(cycles):
            for script in (COALESCED_ACQUIRE, COALESCED_RELEASE):
                out.append(resp("EVALSHA", sha(script), 1, records[0], n, *records, *tokens(c)))
    elif mode in ("lone", "fenced"):
        acquire, release = (compose("acquire"), compose("release")) if mode == "lone" else (FENCED_ACQUIRE,
                                                                                            FENCED_RELEASE)
        out += [resp("SCRIPT", "LOAD", acquire), resp("SCRIPT", "LOAD", release)]
        for c in range(cycles):
            token = tokens(c)[0]
            out.append(resp("EVALSHA", sha(acquire), 1, "lone:1", token, 10000, HOLDER))
            extra = ["1796419155270687"] if mode == "lone" else []  # RELEASE's second argument: the fence
            out.append(resp("EVALSHA", sha(release), 1, "lone:1", token, *extra))
    else:
        sys.exit("mode: spread, coalesced, lone or fenced")
    return b"".join(out), 2 * n * cycles


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True).stdout.decode()


def server_cpu(pid):
    fields = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    port, mode, n, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    calls, ops = commands(mode, n, cycles)
    if "--resp" in sys.argv:
        sys.stdout.buffer.write(calls)
        return
    if port == "6379":
        sys.exit("6379 is a shared server: start one of your own (this FLUSHALLs it)")
    cli(port, "FLUSHALL")
    cli(port, "CONFIG", "RESETSTAT")
    pid = [l.split(":")[1].strip() for l in cli(port, "INFO", "server").splitlines() if l.startswith("process_id")][0]
    before = server_cpu(pid)
    piped = subprocess.run(["redis-cli", "-p", port, "--pipe"], input=calls, capture_output=True, check=True)
    if b"errors: 0" not in piped.stdout:
        sys.exit("calls failed: %s" % piped.stdout.decode())
    cpu = server_cpu(pid) - before
    stats = [l for l in cli(port, "INFO", "commandstats").splitlines() if l.startswith("cmdstat_evalsha:")][0]
    usec = int(stats.split("usec=")[1].split(",")[0])
    print("%s, %d a call: EVALSHA %.3f µs an operation, the server's CPU %.3f µs (%d operations)"
          % (mode, n, usec / ops, cpu * 1e6 / ops, ops))


if __name__ == "__main__":
    main()
