"""Run a command where another architecture's programs run: in a user namespace of its own (ids 0-65535 mapped to
themselves) and a mount namespace, with a binfmt_misc instance of that user namespace in which QEMU's user-mode
emulator runs them (the kernel gives a user namespace its own binfmt_misc from Linux 6.7 on). This machine's own
binfmt_misc, and every process outside, is left as it was. testhost.sh starts an arm64 test host's sshd this way.

    python3 testhost_emulated.py /usr/bin/qemu-aarch64-static chroot ROOT /usr/sbin/sshd -f CONFIG

The emulator is opened when it is registered (flag F), so it need not exist inside ROOT. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
BINFMT = "/proc/sys/fs/binfmt_misc"
# The ELF header of a 64-bit little-endian aarch64 executable, and the bits of it that must match (the kernel's
# escapes: binfmt_misc decodes them); as Debian's qemu-user-static registers qemu-aarch64 (/usr/lib/binfmt.d).
AARCH64 = (
    r":qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
    r":\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:{emulator}:F"
)
IDS = "0 0 65536"


def main(emulator: str, argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child enters the namespaces; its parent, still outside, writes its id maps
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            print(f"unshare: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
            os._exit(90)
        os.write(ready_w, b"1")
        os.read(go_r, 1)
        os.setgid(0)
        os.setuid(0)
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT], check=True)
        with open(f"{BINFMT}/register", "w") as register:
            register.write(AARCH64.format(emulator=emulator))
        os.execvp(argv[0], argv)
    os.read(ready_r, 1)
    for name, value in (("uid_map", IDS), ("setgroups", "allow"), ("gid_map", IDS)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(value + "\n")
    os.write(go_w, b"1")
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} EMULATOR COMMAND [ARG ...]")
    sys.exit(main(sys.argv[1], sys.argv[2:]))
