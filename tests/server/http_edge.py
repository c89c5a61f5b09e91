#!/usr/bin/env python3
"""http_edge.py - `deltafin serve` at the HTTP level, on raw sockets: request
framing that a proxy and the server could read differently, half-closed
clients, the request deadline and the per-address connection limit.

    http_edge.py framing PORT
    http_edge.py halfclose PORT
    http_edge.py slow PORT TIMEOUT PER_IP KEY  (a server started with
                                                --request-timeout TIMEOUT
                                                --max-conns-per-ip PER_IP
                                                and the API key KEY)

Prints one line per check, "ok NAME" or "FAIL NAME: why" (read by
tests/test_server.sh). Clients connect from 127.0.0.1, and from 127.0.0.2 for
the per-address limit (all of 127/8 is loopback on Linux).
"""
import json
import select
import socket
import sys
import threading
import time

HOST = "127.0.0.1"
BODY = b'{"model":"m","prompt":"hi","max_tokens":2,"temperature":0}'
lock = threading.Lock()


def report(name, err):
    with lock:
        print(f"ok {name}" if not err else f"FAIL {name}: {err}", flush=True)


def run_all(checks):
    """Runs the checks (name, function returning an error or None) at once."""
    def one(name, fn):
        try:
            report(name, fn())
        except Exception as e:  # a crash of the check is its failure
            report(name, f"{type(e).__name__}: {e}")
    th = [threading.Thread(target=one, args=c) for c in checks]
    for t in th:
        t.start()
    for t in th:
        t.join()


def connect(port, src=HOST):
    s = socket.socket()
    s.bind((src, 0))
    s.connect((HOST, port))
    return s


def exchange(port, data, half_close=False, timeout=3.0):
    """Sends data; returns (everything received until the server closed, closed?)."""
    s = connect(port)
    s.settimeout(timeout)
    out, closed = b"", False
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        while True:
            b = s.recv(65536)
            if not b:
                closed = True
                break
            out += b
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    finally:
        s.close()
    return out, closed


def parse_responses(raw):
    """Splits raw bytes into responses [(status, {header: value}, body)]; 1xx
    interim responses included. Raises ValueError on bytes that are not one."""
    res = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            raise ValueError(f"truncated head {raw[:80]!r}")
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"not a status line: {lines[0][:80]!r}")
        status = int(parts[1])
        hdr = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            hdr[k.strip().lower().decode()] = v.strip().decode()
        if status < 200:
            body = b""
        elif hdr.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                body, rest = body + rest[:n], rest[n + 2:]
                if n == 0:
                    break
        elif "content-length" in hdr:
            n = int(hdr["content-length"])
            if len(rest) < n:
                raise ValueError(f"body of {len(rest)} bytes, Content-Length {n}")
            body, rest = rest[:n], rest[n:]
        else:
            body, rest = rest, b""
        res.append((status, hdr, body))
        raw = rest
    return res


def final(raw):
    """The one final response among the interim ones, or an error string."""
    try:
        res = [r for r in parse_responses(raw) if r[0] >= 200]
    except ValueError as e:
        return f"malformed response: {e}"
    if len(res) != 1:
        return f"{len(res)} responses: {[r[0] for r in res]} ({raw[:300]!r})"
    return res[0]


def refused(port, data, status, words):
    """The request gets exactly one response, `status` with an OpenAI error whose
    message holds `words`, and the connection is closed at once."""
    t0 = time.time()
    raw, closed = exchange(port, data)
    r = final(raw)
    if isinstance(r, str):
        return r
    st, hdr, body = r
    if st != status:
        return f"status {st} (want {status}): {body[:200]!r}"
    try:
        msg = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"not an OpenAI error: {body[:200]!r}"
    if words.lower() not in msg.lower():
        return f"message {msg!r} does not name {words!r}"
    if not closed or time.time() - t0 > 2:
        return "the connection was not closed at once"
    return None


def post_head(extra, path=b"/v1/completions"):
    return b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra + b"\r\n"


def framing(port):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    smuggled = b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n"
    n = len(BODY)
    run_all([
        # Content-Length covers the chunked body and the request after it
        ("framing-cl-and-te", lambda: refused(
            port, post_head(b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(chunked)) + chunked
            + smuggled, 400, "Transfer-Encoding")),
        ("framing-two-content-length", lambda: refused(
            port, post_head(b"Content-Length: %d\r\nContent-Length: %d\r\n" % (n, n + 10)) + BODY, 400,
            "more than one Content-Length")),
        ("framing-negative-content-length", lambda: refused(
            port, post_head(b"Content-Length: -5\r\n"), 400, "Content-Length '-5'")),
        ("framing-content-length-not-digits", lambda: next(
            (e for e in (refused(port, post_head(b"Content-Length: %s\r\n" % v) + BODY, 400, "Content-Length")
                         for v in (b"+%d" % n, b"0x3a", b"%d, %d" % (n, n), b"%d " % n)) if e), None)),
        ("framing-two-transfer-encoding", lambda: refused(
            port, post_head(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n") + chunked, 400,
            "more than one Transfer-Encoding")),
        ("framing-transfer-coding-501", lambda: refused(
            port, post_head(b"Transfer-Encoding: gzip, chunked\r\n") + b"0\r\n\r\n", 501, "gzip, chunked")),
        # a name with a space is another header to a lenient parser, the length to a proxy
        ("framing-space-in-name", lambda: refused(
            port, post_head(b"Content-Length : %d\r\n" % n) + BODY, 400, "not a token")),
        ("framing-folded-header", lambda: refused(
            port, post_head(b"X-A: 1\r\n Content-Length: %d\r\n" % n) + BODY, 400, "white space")),
        ("framing-bare-cr", lambda: refused(
            port, post_head(b"X-A: 1\rContent-Length: %d\r\n" % n) + BODY, 400, "CR")),
        ("framing-head-too-large", lambda: refused(
            port, post_head(b"X-Big: " + b"a" * 20000 + b"\r\n"), 431, "larger than")),
        ("framing-chunked-ok", lambda: chunked_ok(port, chunked)),
    ])


def chunked_ok(port, chunked):
    r = final(exchange(port, post_head(b"Transfer-Encoding: chunked\r\n") + chunked)[0])
    if isinstance(r, str):
        return r
    if r[0] != 200 or "choices" not in json.loads(r[2]):
        return f"status {r[0]}: {r[2][:200]!r}"
    return None


def halfclose(port):
    """A complete request followed by shutdown(SHUT_WR), as `nc -N` sends it,
    gets its whole response."""
    def answered(data, stream):
        raw, closed = exchange(port, data, half_close=True, timeout=20)
        r = final(raw)
        if isinstance(r, str):
            return r
        st, _, body = r
        if st != 200:
            return f"status {st}: {body[:200]!r}"
        if stream:
            return None if body.endswith(b"data: [DONE]\n\n") else f"stream cut: {body[-100:]!r}"
        return None if json.loads(body)["usage"]["completion_tokens"] == 2 else f"body {body[:200]!r}"
    sb = BODY[:-1] + b',"stream":true}'
    run_all([
        ("halfclose-completion", lambda: answered(post_head(b"Content-Length: %d\r\n" % len(BODY)) + BODY, False)),
        ("halfclose-stream", lambda: answered(post_head(b"Content-Length: %d\r\n" % len(sb)) + sb, True)),
        ("halfclose-chunked", lambda: answered(
            post_head(b"Transfer-Encoding: chunked\r\n") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY), False)),
        ("halfclose-http10", lambda: answered(
            b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY, False)),
    ])


def trickled(port, data, timeout, src=HOST):
    """Sends data a byte every 0.2 s (and nothing once it is sent); returns
    (seconds until the server closed or None, bytes received)."""
    s = connect(port, src)
    s.settimeout(0.2)
    t0, got, i = time.time(), b"", 0
    try:
        while time.time() - t0 < timeout + 3:
            if i < len(data):
                s.send(data[i:i + 1])
                i += 1
            try:
                b = s.recv(4096)
                if not b:
                    return time.time() - t0, got
                got += b
            except socket.timeout:
                pass
    except OSError:
        return time.time() - t0, got
    finally:
        s.close()
    return None, got


def cut_at_deadline(port, data, timeout, want_408):
    el, got = trickled(port, data, timeout)
    if el is None:
        return f"still open {timeout + 3} s after connecting (request timeout {timeout} s)"
    if not timeout - 0.5 <= el <= timeout + 1.5:
        return f"closed after {el:.1f} s (request timeout {timeout} s)"
    if want_408 and not got.startswith(b"HTTP/1.1 408 "):
        return f"closed without a 408: {got[:100]!r}"
    return None


def long_answer_kept(port, timeout, key):
    """A generation that outlasts the request timeout is not cut: the request
    had arrived."""
    b = b'{"model":"m","prompt":"Tell me a story","max_tokens":2000,"temperature":0,"stream":true}'
    s = connect(port)
    s.sendall(post_head(b"Authorization: Bearer %s\r\nContent-Length: %d\r\n" % (key.encode(), len(b))) + b)
    s.settimeout(0.5)
    t0, last, got = time.time(), 0.0, b""
    try:
        while time.time() - t0 < timeout + 1.5:
            try:
                b = s.recv(65536)
                if not b:
                    return f"closed after {time.time() - t0:.1f} s: {got[:100]!r}"
                got, last = got + b, time.time() - t0
            except socket.timeout:
                pass
    finally:
        s.close()  # cancels the generation
    if not got.startswith(b"HTTP/1.1 200 "):
        return f"answer {got[:100]!r}"
    return None if last > timeout + 0.5 else f"no data after {last:.1f} s"


def health(port, src, timeout=3.0):
    """Error string unless GET /health from src is answered 200 within timeout."""
    try:
        s = connect(port, src)
    except OSError as e:
        return f"connect: {e}"
    s.settimeout(timeout)
    raw = b""
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        while b"\r\n\r\n" not in raw or not raw.endswith(b"}"):
            b = s.recv(4096)
            if not b:
                break
            raw += b
    except OSError as e:  # a timeout included
        return f"not answered within {timeout} s ({e}): {raw[:100]!r}"
    finally:
        s.close()
    return None if raw.startswith(b"HTTP/1.1 200 ") else f"answer {raw[:100]!r}"


def per_address(port, timeout, per_ip):
    """More trickling connections from 127.0.0.2 than the server holds in all:
    it keeps per_ip of them, others are still served, and the request timeout
    frees 127.0.0.2's places."""
    crowd = []
    for _ in range(300):
        s = connect(port, "127.0.0.2")
        s.send(b"G")
        crowd.append(s)
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.5):
            for s in crowd:
                try:
                    s.send(b"E")
                except OSError:
                    pass
    t = threading.Thread(target=trickle)
    t.start()
    try:
        time.sleep(0.5)
        err = health(port, HOST)
        report("per-address-others-served", err and f"from 127.0.0.1 with 300 trickling from 127.0.0.2: {err}")
        kept = [s for s in crowd if not closed_now(s)]
        report("per-address-limit", None if len(kept) == per_ip else
               f"{len(kept)} of 300 connections from 127.0.0.2 kept (limit {per_ip})")
        t0 = time.time()
        while time.time() - t0 < timeout + 2 and any(not closed_now(s) for s in kept):
            time.sleep(0.1)
        left = sum(not closed_now(s) for s in kept)
        err = left and f"{left} trickling connections still open {timeout + 2} s later"
        err = err or health(port, "127.0.0.2")
        report("per-address-freed-by-timeout", err and f"from 127.0.0.2: {err}")
    finally:
        stop.set()
        t.join()
        for s in crowd:
            s.close()


def closed_now(s):
    """Whether the server has closed this connection (reads what it said first)."""
    try:
        while select.select([s], [], [], 0)[0]:
            if not s.recv(65536):
                return True
        return False
    except OSError:
        return True


def slow(port, timeout, per_ip, key):
    def crowd():
        try:
            per_address(port, timeout, per_ip)
        except Exception as e:
            report("per-address", f"{type(e).__name__}: {e}")
    t = threading.Thread(target=crowd)
    t.start()
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"x" * 200 + b"\r\n\r\n"
    run_all([
        ("request-timeout-head", lambda: cut_at_deadline(port, head, timeout, True)),
        ("request-timeout-body", lambda: cut_at_deadline(
            port, post_head(b"Content-Length: %d\r\n" % 200) + b" " * 200, timeout, False)),
        ("request-timeout-spares-answers", lambda: long_answer_kept(port, timeout, key)),
    ])
    t.join()


def main():
    cmd, port = sys.argv[1], int(sys.argv[2])
    if cmd == "framing":
        framing(port)
    elif cmd == "halfclose":
        halfclose(port)
    elif cmd == "slow":
        slow(port, int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(f"unknown check {cmd!r}")


if __name__ == "__main__":
    main()
