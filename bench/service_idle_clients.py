#!/usr/bin/env python3
"""Opens N keep-alive connections to the service, sends one GET on each, reads each
answer, and keeps them all open. Writes "ready <answered>" to READY_FILE once every
connection has been answered (or after 25 s, under the service's 30 s idle timeout),
then holds the connections until killed.

usage: service_idle_clients.py PORT N READY_FILE
"""
import selectors
import socket
import sys
import time

port, total, ready_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"
sel = selectors.DefaultSelector()
socks, answered, opened = [], 0, 0
start = time.monotonic()
while answered < total and time.monotonic() - start < 25:
    # Keep at most 500 connections waiting for their answer (the listen backlog).
    while opened < total and opened - answered < 500:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE, "connecting")
        socks.append(s)
        opened += 1
    for key, _ in sel.select(timeout=0.5):
        s = key.fileobj
        if key.data == "connecting":
            s.sendall(request)
            sel.modify(s, selectors.EVENT_READ, "waiting")
        else:
            if s.recv(4096).startswith(b"HTTP/1.1"):
                answered += 1
            sel.unregister(s)
with open(ready_file, "w") as f:
    f.write(f"ready {answered}\n")
while True:
    time.sleep(3600)
