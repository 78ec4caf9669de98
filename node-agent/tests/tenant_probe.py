#!/usr/bin/env python3
"""A tenant's runtime gone bad, run as the tenants' uid by tests/agent.rs: asks the agent's
socket for code, then tries to change the file it was handed and to look into the store.
Prints one line per try: what it tried and `ok` or the errno's name."""

import errno
import os
import socket
import sys

path, digest, store = sys.argv[1:4]
connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
connection.connect(path)
connection.send(f"get {digest}".encode())
message, fds, _, _ = socket.recv_fds(connection, 8192, 1)
print("reply", message.split(b"\n")[0].decode())
fd = fds[0]


def attempt(name, action):
    try:
        action()
        print(name, "ok")
    except OSError as error:
        print(name, errno.errorcode[error.errno])


attempt("read", lambda: os.pread(fd, 4, 0) == b"\x7fELF" or (_ for _ in ()).throw(OSError(errno.EIO, "not code")))
attempt("write", lambda: os.pwrite(fd, b"\x00", 0))
attempt("reopen-for-writing", lambda: os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
attempt("chmod", lambda: os.fchmod(fd, 0o666))
attempt("list-store", lambda: os.listdir(store))
