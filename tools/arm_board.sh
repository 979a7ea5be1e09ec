#!/usr/bin/env bash
# An emulated aarch64 board for trying the ARM path without one: a Debian bookworm arm64 root (debootstrap),
# run through qemu-user (binfmt_misc), with TVM's own aarch64 wheels in a venv, serving TVM RPC on loopback.
#
#   tools/arm_board.sh setup                     # idempotent: packages, binfmt, root, wheels, venv (~5 min once)
#   tools/arm_board.sh start [--port 9091] [--tracker-port 9190 --key arm-board]
#   tools/arm_board.sh status | stop
#   tools/arm_board.sh up [...]                  # setup, then start
#
# The board lives outside the repository: ${TVM_ROIALIGN_BOARD_DIR:-$HOME/.cache/tvm-roialign/arm-board}.
# `start --tracker-port T` also starts a tracker on 127.0.0.1:T (on the host) and a second server on
# --port + 2 registered there under --key (default arm-board). Real boards use the same client flags (run --rpc / --rpc-tracker --rpc-key).
# Needs root (apt-get, debootstrap, mount, chroot). One RPC session per server at a time.
set -euo pipefail

BOARD_DIR=${TVM_ROIALIGN_BOARD_DIR:-$HOME/.cache/tvm-roialign/arm-board}
ROOT=$BOARD_DIR/root
WHEELS=$ROOT/opt/wheels            # inside the root, so the chroot sees them as /opt/wheels
VENV=/opt/tvm                      # path inside the root
HOST_PYTHON=${TVM_ROIALIGN_HOST_PYTHON:-python3}   # pip download; the tracker: see tracker_python
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=9091
TRACKER_PORT=
KEY=arm-board
APT_PACKAGES="qemu-user-static binfmt-support debootstrap gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
PIP_PACKAGES=("apache-tvm==0.27.*" "apache-tvm-ffi>=0.1.14,<0.1.15" numpy cloudpickle psutil)

log() { echo "arm_board: $*" >&2; }
die() { log "error: $*"; exit 1; }

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --port) PORT=$2; shift 2 ;;
            --tracker-port) TRACKER_PORT=$2; shift 2 ;;
            --key) KEY=$2; shift 2 ;;
            *) die "unknown argument '$1' (expected --port P, --tracker-port T, --key K)" ;;
        esac
    done
}

install_packages() {
    local missing=()
    for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# qemu-user-static registers its binfmt handlers through binfmt-support; a container may not have binfmt_misc
# mounted (then the handlers are missing even though the package is installed): mount it and enable them.
enable_binfmt() {
    local bm=/proc/sys/fs/binfmt_misc
    if [ ! -e "$bm/status" ]; then
        log "mounting binfmt_misc on $bm"
        mount -t binfmt_misc binfmt_misc "$bm" || die "cannot mount binfmt_misc (the container needs CAP_SYS_ADMIN, or the host must register qemu-aarch64 with the F flag)"
    fi
    if [ ! -e "$bm/qemu-aarch64" ]; then
        log "enabling the qemu-aarch64 binfmt handler"
        update-binfmts --enable qemu-aarch64 || update-binfmts --import qemu-aarch64
    fi
    [ -e "$bm/qemu-aarch64" ] || die "qemu-aarch64 is not registered in $bm"
}

debian_mirror() {
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1)
    [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        | awk '{print $2}' | grep -v security | head -1)
    echo "${uri:-http://deb.debian.org/debian}"
}

make_root() {
    [ -x "$ROOT/usr/bin/python3" ] && [ -e "$ROOT/.debootstrap-done" ] && return 0
    local mirror; mirror=$(debian_mirror)
    log "debootstrap arm64 bookworm into $ROOT from $mirror (a few minutes)"
    mkdir -p "$ROOT"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$ROOT" "$mirror" >"$BOARD_DIR/debootstrap.log" 2>&1 \
        || die "debootstrap failed, see $BOARD_DIR/debootstrap.log"
    touch "$ROOT/.debootstrap-done"
}

download_wheels() {
    [ -e "$WHEELS/.done" ] && return 0
    log "downloading TVM's aarch64 wheels into $WHEELS"
    mkdir -p "$WHEELS"
    "$HOST_PYTHON" -m pip download -q --platform manylinux_2_28_aarch64 --python-version 3.11 \
        --only-binary=:all: "${PIP_PACKAGES[@]}" -d "$WHEELS"
    touch "$WHEELS/.done"
}

mount_proc() {
    mountpoint -q "$ROOT/proc" || mount --bind /proc "$ROOT/proc"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
}

make_venv() {
    [ -e "$ROOT$VENV/.done" ] && return 0
    mount_proc
    log "creating the board's venv $VENV (pip install under emulation, a minute or two)"
    chroot "$ROOT" python3 -m venv "$VENV"
    chroot "$ROOT" "$VENV/bin/pip" install -q --no-index --find-links /opt/wheels "${PIP_PACKAGES[@]}"
    chroot "$ROOT" "$VENV/bin/python" -c "import tvm, platform; print('board:', platform.machine(), 'tvm', tvm.__version__)"
    touch "$ROOT$VENV/.done"
}

setup() {
    [ "$(id -u)" = 0 ] || die "run as root (apt-get, debootstrap, mount and chroot need it)"
    mkdir -p "$BOARD_DIR"
    local t0=$SECONDS
    install_packages
    enable_binfmt
    make_root
    download_wheels
    make_venv
    log "board ready in $ROOT ($((SECONDS - t0)) s)"
}

wait_port() {  # host port seconds
    local i
    for ((i = 0; i < $3; i++)); do
        (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
        sleep 1
    done
    return 1
}

# The tracker runs on the host, with TVM: `sudo` drops the caller's venv from PATH (and a fresh
# machine's python3 has no TVM), so the first of these that imports TVM's tracker runs it.
tracker_python() {
    local py
    for py in "${TVM_ROIALIGN_HOST_PYTHON:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" \
        "$REPO/.venv/bin/python" python3; do
        [ -n "$py" ] || continue
        "$py" -c "import tvm.rpc.tracker" >/dev/null 2>&1 && { echo "$py"; return 0; }
    done
    die "no Python here imports TVM's RPC tracker (tvm and tornado: pip install \"tvm-roialign[tune]\"); set TVM_ROIALIGN_HOST_PYTHON to one that does"
}

running() { [ -e "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_server() {  # name port [rpc_server args...]
    local name=$1 port=$2; shift 2
    if running "$BOARD_DIR/$name.pid"; then
        log "the $name is already running (pid $(cat "$BOARD_DIR/$name.pid")); stop it first to restart"
        return 0
    fi
    log "starting the board's $name on 127.0.0.1:$port $*"
    setsid nohup chroot "$ROOT" "$VENV/bin/python" -m tvm.exec.rpc_server --host 127.0.0.1 --port "$port" \
        --port-end "$((port + 1))" "$@" >"$BOARD_DIR/$name.log" 2>&1 &
    echo $! >"$BOARD_DIR/$name.pid"
    wait_port 127.0.0.1 "$port" 300 || die "the $name did not start, see $BOARD_DIR/$name.log"
}

# A server registered at a tracker only takes the sessions the tracker hands out, so the board
# serves both ways: a plain server on --port (run --rpc) and, with --tracker-port, one more on
# --port + 2 registered under --key (run / tune --rpc-tracker --rpc-key).
start() {
    [ -e "$ROOT$VENV/.done" ] || die "the board is not set up: run tools/arm_board.sh setup"
    enable_binfmt
    mount_proc
    local t0=$SECONDS env_line="TVM_ROIALIGN_BOARD=127.0.0.1:$PORT"
    start_server server "$PORT"
    if [ -n "$TRACKER_PORT" ]; then
        if ! running "$BOARD_DIR/tracker.pid"; then
            local py; py=$(tracker_python)
            log "starting a tracker on 127.0.0.1:$TRACKER_PORT ($py)"
            setsid nohup "$py" -m tvm.exec.rpc_tracker --host 127.0.0.1 --port "$TRACKER_PORT" \
                --port-end "$((TRACKER_PORT + 1))" >"$BOARD_DIR/tracker.log" 2>&1 &
            echo $! >"$BOARD_DIR/tracker.pid"
            wait_port 127.0.0.1 "$TRACKER_PORT" 60 || die "the tracker did not start, see $BOARD_DIR/tracker.log"
        fi
        start_server tracked-server "$((PORT + 2))" --tracker "127.0.0.1:$TRACKER_PORT" --key "$KEY"
        env_line+=" TVM_ROIALIGN_BOARD_TRACKER=127.0.0.1:$TRACKER_PORT TVM_ROIALIGN_BOARD_KEY=$KEY"
    fi
    log "board up in $((SECONDS - t0)) s: export $env_line"
}

stop() {
    local f
    for f in server tracked-server tracker; do
        if running "$BOARD_DIR/$f.pid"; then
            log "stopping the $f (pid $(cat "$BOARD_DIR/$f.pid"))"
            # its own session (setsid): the group holds the popen worker that owns the port
            kill -- "-$(cat "$BOARD_DIR/$f.pid")" 2>/dev/null || kill "$(cat "$BOARD_DIR/$f.pid")" || true
        fi
        rm -f "$BOARD_DIR/$f.pid"
    done
}

status() {
    local f
    for f in server tracked-server tracker; do
        if running "$BOARD_DIR/$f.pid"; then echo "$f: running (pid $(cat "$BOARD_DIR/$f.pid"))"
        else echo "$f: stopped"; fi
    done
    [ -e "$ROOT$VENV/.done" ] && echo "root: $ROOT (set up)" || echo "root: $ROOT (not set up)"
}

cmd=${1:-up}
[ $# -gt 0 ] && shift
parse_args "$@"
case "$cmd" in
    setup) setup ;;
    start) start ;;
    up) setup; start ;;
    stop) stop ;;
    status) status ;;
    *) die "unknown command '$cmd' (expected setup, start, up, stop or status)" ;;
esac
