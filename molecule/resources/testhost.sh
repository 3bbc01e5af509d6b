#!/usr/bin/env bash
# Test hosts for the molecule scenarios, without a container engine: each host is an sshd in a
# network namespace of its own, reached over a veth pair on a 10.x /30 that this script creates
# and removes, chrooted into an overlay of this machine's root (writes land in a tmpfs upper layer,
# so the roles change nothing outside the test host).
#
#   testhost.sh up   NAME NETNS HOST_IP NODE_IP STATE_DIR PUBKEY [SRC:DST ...]
#   testhost.sh down NAME NETNS STATE_DIR
#
# SRC:DST bind-mounts SRC read-only at DST inside the host (a wheelhouse, for example).
# The host has /run/systemd/container, as under systemd-nspawn: it shares this machine's kernel,
# so roles must detect it and leave the kernel alone.
#
# TESTHOST_LOWER=DIR takes DIR (another system's root) as the overlay's lower layer instead of this machine's /.
# TESTHOST_EMULATOR=QEMU runs that root's programs (another architecture's: an arm64 userland) through QEMU's
# user-mode emulator, registered in a user namespace of the host's own (testhost_emulated.py): its sshd and every
# session it starts run there; this machine's binfmt_misc is left as it was.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# A program of the host's root: as it is, or through the emulator.
in_root() {
  if [ -n "${TESTHOST_EMULATOR:-}" ]; then
    python3 "$here/testhost_emulated.py" "$TESTHOST_EMULATOR" chroot "$root" "$@"
  else
    chroot "$root" "$@"
  fi
}

up() {
  local name=$1 netns=$2 host_ip=$3 node_ip=$4 state=$5 pubkey=$6
  shift 6
  local dir=$state/$name root=$state/$name/root veth=${netns}-h
  mkdir -p "$dir"
  mountpoint -q "$dir" || mount -t tmpfs -o size=8g,mode=0700 gpufleet-testhost "$dir"
  mkdir -p "$dir/upper" "$dir/work" "$root"
  mount -t overlay gpufleet-testhost -o "lowerdir=${TESTHOST_LOWER:-/},upperdir=$dir/upper,workdir=$dir/work" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --make-rslave "$root/dev"
  mount -t tmpfs tmpfs "$root/run"
  mount -t tmpfs tmpfs "$root/tmp"
  # pyenv's shims, where this machine's root has them: every ssh session's login shell rewrites them (pyenv init)
  # under a lock file. The overlay does not follow changes to its lower layer, so a lock this machine's own rehash
  # took and dropped can stay in the host's view, and every session then waits pyenv's 60 s for it. The host
  # gets a folder of its own, which its first session fills.
  local shims=${PYENV_ROOT:-${HOME:-/root}/.pyenv}/shims
  if [ -d "$shims" ] && [ -d "$root$shims" ]; then
    mount -t tmpfs tmpfs "$root$shims"
  fi
  mkdir -p "$root/run/systemd" "$root/run/sshd" "$root/root/.ssh"
  echo gpufleet-testhost > "$root/run/systemd/container"
  install -m 0600 "$pubkey" "$root/root/.ssh/authorized_keys"
  in_root ssh-keygen -A >/dev/null
  cat > "$root/etc/ssh/sshd_config_gpufleet_testhost" <<EOF
ListenAddress $node_ip
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PidFile /run/sshd.pid
Subsystem sftp internal-sftp
EOF
  for bind in "$@"; do
    mkdir -p "$root${bind#*:}"
    mount --bind "${bind%%:*}" "$root${bind#*:}"
    mount -o remount,bind,ro "$root${bind#*:}"
  done

  ip netns add "$netns"
  ip link add "$veth" type veth peer name "${netns}-n"
  ip link set "${netns}-n" netns "$netns"
  ip -n "$netns" link set "${netns}-n" name eth0
  ip addr add "$host_ip/30" dev "$veth"
  ip link set "$veth" up
  ip -n "$netns" addr add "$node_ip/30" dev eth0
  ip -n "$netns" link set eth0 up
  ip -n "$netns" link set lo up
  # sysfs mounted from inside the namespace shows its own interfaces (lo, eth0) under class/net.
  if [ -n "${TESTHOST_EMULATOR:-}" ]; then
    # sshd runs as root of a user namespace, which may bind port 22 only where the network namespace lets it.
    ip netns exec "$netns" sysctl -qw net.ipv4.ip_unprivileged_port_start=22
    ip netns exec "$netns" sh -c "mount -t sysfs sysfs '$root/sys' && exec python3 '$here/testhost_emulated.py' \
      '$TESTHOST_EMULATOR' chroot '$root' /usr/sbin/sshd -f /etc/ssh/sshd_config_gpufleet_testhost"
  else
    ip netns exec "$netns" sh -c "mount -t sysfs sysfs '$root/sys' && exec chroot '$root' /usr/sbin/sshd -f /etc/ssh/sshd_config_gpufleet_testhost"
  fi
  # An emulated sshd takes longer to listen: a minute, not ten seconds.
  for _ in $(seq "$([ -n "${TESTHOST_EMULATOR:-}" ] && echo 300 || echo 50)"); do
    if timeout 1 bash -c "exec 3<>/dev/tcp/$node_ip/22" 2>/dev/null; then
      echo "$name: sshd on $node_ip:22 in netns $netns, root $root"
      return 0
    fi
    sleep 0.2
  done
  echo "$name: sshd did not answer on $node_ip:22" >&2
  return 1
}

down() {
  local name=$1 netns=$2 state=$3
  local dir=$state/$name root=$state/$name/root
  if ip netns list | grep -qw "^$netns"; then
    # Only processes of this host live in its namespace: sshd and the sessions it started.
    for pid in $(ip netns pids "$netns"); do
      kill "$pid" 2>/dev/null || true
    done
    sleep 0.3
    for pid in $(ip netns pids "$netns"); do
      kill -9 "$pid" 2>/dev/null || true
    done
    ip netns del "$netns"
  fi
  ip link del "${netns}-h" 2>/dev/null || true
  if [ -d "$root" ]; then
    umount -R "$root" 2>/dev/null || umount -R -l "$root" 2>/dev/null || true
  fi
  if mountpoint -q "$dir" 2>/dev/null; then
    umount "$dir" || umount -l "$dir"
  fi
  rm -rf "$dir"
  echo "$name: removed"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  *) echo "usage: $0 up NAME NETNS HOST_IP NODE_IP STATE_DIR PUBKEY [SRC:DST ...] | down NAME NETNS STATE_DIR" >&2; exit 64 ;;
esac
