#!/bin/busybox sh
# /init of the siw guest (copied verbatim into the initramfs by iwarp_tb.siw.image).
#
# Reads its job from the kernel command line (parameters with a dot never reach init's
# environment, so it parses /proc/cmdline):
#   iwarp.role=ROLE   idle | rping-server | rping-client | ucmatose-server | ucmatose-client |
#                     ib_write_bw-server | ib_write_bw-client (also ib_read_bw, ib_send_bw,
#                     ib_write_lat)
#   iwarp.ip=A/N      eth0's address (default 169.254.1.2/24)
#   iwarp.peer=A      the other side's address (clients)
#   iwarp.port=P      the rdma_cm port (default: the tool's own)
#   iwarp.count=N     pings, messages or iterations (default 10)
#   iwarp.size=B      message size (default: the tool's own)
#   iwarp.tries=N     client connection attempts, 1 s apart (default 30)
#   iwarp.hold=S      idle: seconds to stay up (default 30)
#   iwarp.timeout=S   each tool run is killed after S seconds (default 60; rc 137)
#   iwarp.debug=1     keep kernel messages on the console
# Prints "IWARP-READY ..." when siw0 is up, the tool's output between IWARP-OUTPUT-BEGIN and
# IWARP-OUTPUT-END, then "IWARP-RESULT role=... rc=... [key=value ...]", and powers off.

/bin/busybox --install -s
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /tmp && mount -t tmpfs tmpfs /tmp

role=idle ip=169.254.1.2/24 peer= port= count=10 size= tries=30 hold=30 debug=0 tlimit=60
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    iwarp.role=*) role=${arg#*=} ;;
    iwarp.ip=*) ip=${arg#*=} ;;
    iwarp.peer=*) peer=${arg#*=} ;;
    iwarp.port=*) port=${arg#*=} ;;
    iwarp.count=*) count=${arg#*=} ;;
    iwarp.size=*) size=${arg#*=} ;;
    iwarp.tries=*) tries=${arg#*=} ;;
    iwarp.hold=*) hold=${arg#*=} ;;
    iwarp.debug=*) debug=${arg#*=} ;;
    iwarp.timeout=*) tlimit=${arg#*=} ;;
  esac
done
variant=$(cat /etc/iwarp-variant 2>/dev/null)
addr=${ip%/*}

finish() {  # finish RC [key=value ...]: print the result line and power off
  rc=$1
  shift
  if [ "$rc" != 0 ]; then
    echo "IWARP-DMESG-BEGIN"
    dmesg | tail -n 40
    echo "IWARP-DMESG-END"
  fi
  echo "IWARP-RESULT role=$role rc=$rc variant=$variant $*"
  sync
  poweroff -f
  sleep 5
  reboot -f
}

for m in $(cat /lib/modules/order) siw.ko; do
  insmod "/lib/modules/$m" 2>/tmp/insmod.err || {
    grep -q "File exists" /tmp/insmod.err || echo "IWARP-WARN insmod $m: $(cat /tmp/insmod.err)"
  }
done

ip link set lo up
ip link set eth0 up || finish 1 error=no-eth0
ip addr add "$ip" dev eth0 || finish 1 error=ip-addr
rdma link add siw0 type siw netdev eth0 || finish 1 error=siw-link
n=0
until [ -e /dev/infiniband/uverbs0 ] && [ -e /dev/infiniband/rdma_cm ]; do
  n=$((n + 1))
  [ $n -gt 50 ] && finish 1 error=no-uverbs-device
  sleep 0.1
done
if [ "$debug" = 1 ]; then  # siw's and iw_cm's debug messages on the console
  mount -t debugfs debugfs /sys/kernel/debug
  for m in siw iw_cm; do
    echo "module $m +p" > /sys/kernel/debug/dynamic_debug/control
  done
else
  echo 1 > /proc/sys/kernel/printk
fi
echo "IWARP-READY role=$role ip=$ip variant=$variant kernel=$(uname -r)"

wait_peer() {  # until the peer answers ARP and ping: it has booted and configured eth0
  n=0
  until ping -c 1 -W 1 "$peer" >/dev/null 2>&1; do
    n=$((n + 1))
    [ $n -ge "$tries" ] && finish 1 error=peer-unreachable
  done
}

# run_tool COMMAND...: run it under the time limit; rc is its exit status, /tmp/err its standard
# error, and /tmp/out its standard output followed by that standard error. (A tool's standard
# output to a file is flushed only at exit, so the two in one file would not be in order anyway.)
# When $gives_up is set, a run whose standard error shows that pattern is killed at once (rc 137)
# rather than at the time limit: see the rping roles.
gives_up=
run_tool() {
  # busybox timeout execs the command itself (its watcher is the child), so $! is the tool
  timeout -s KILL "$tlimit" "$@" >/tmp/out 2>/tmp/err &
  tool=$!
  if [ -n "$gives_up" ]; then
    while kill -0 "$tool" 2>/dev/null; do
      grep -qE "$gives_up" /tmp/err && kill -KILL "$tool" 2>/dev/null
      sleep 0.2
    done
  fi
  wait "$tool"
  rc=$?
  cat /tmp/err >>/tmp/out
}

# run_client COMMAND...: retry while the result shows the server was not listening yet
run_client() {
  attempt=0
  while :; do
    attempt=$((attempt + 1))
    run_tool "$@"
    ok=$(ok_lines)
    [ "$ok" -gt 0 ] && break
    [ $attempt -ge "$tries" ] && break
    { echo "attempt $attempt: rc=$rc"; tail -n 5 /tmp/out; } >>/tmp/earlier
    sleep 1
  done
}

show() {
  if [ -s /tmp/earlier ]; then
    echo "IWARP-EARLIER-BEGIN"
    cat /tmp/earlier
    echo "IWARP-EARLIER-END"
  fi
  echo "IWARP-OUTPUT-BEGIN"
  cat /tmp/out
  echo "IWARP-OUTPUT-END"
}

opt() {  # opt FLAG VALUE: "FLAG VALUE" when VALUE is set
  [ -n "$2" ] && echo "$1 $2"
}

attempt=1
case "$role" in
  idle)
    sleep "$hold"
    finish 0
    ;;
  rping-server|rping-client)
    ok_lines() { grep -c "ping data:" /tmp/out; }
    if [ "$role" = rping-server ]; then
      run_tool rping -s -v -a "$addr" -C "$count" $(opt -p "$port") $(opt -S "$size")
    else
      wait_peer
      # The server guest may not listen yet when the client's first try arrives (both boot at
      # once). rping (rdma-core 44) then prints "connect error" and hangs in its teardown until
      # the time limit, by which the server, its own limit spent, has gone; end that try at once.
      gives_up="^connect error"
      run_client rping -c -v -a "$peer" -C "$count" $(opt -p "$port") $(opt -S "$size")
    fi
    show
    pings=$(ok_lines)
    # rdma-core before 58 (Debian ships 44) has a teardown race: the main thread destroys the CM
    # event channel while the CM thread may be about to read it again, and the thread then exits
    # 255 with "rdma_get_cm_event: Bad file descriptor" after a run that succeeded (fixed upstream
    # by commit f3ae6534, "rping: terminate CM event thread before exiting"). Only that exact exit,
    # its message the last on standard error, after every ping, counts as a pass, and the result
    # line says it happened.
    race=0
    if [ "$rc" = 255 ] && [ "$pings" = "$count" ] &&
       [ "$(tail -n 1 /tmp/err)" = "rdma_get_cm_event: Bad file descriptor" ]; then
      rc=0
      race=1
    fi
    [ "$pings" = "$count" ] || [ "$rc" != 0 ] || rc=1
    finish "$rc" "pings=$pings attempts=$attempt teardown_race=$race"
    ;;
  ucmatose-server|ucmatose-client)
    ok_lines() { grep -c "^return status 0" /tmp/out; }
    if [ "$role" = ucmatose-server ]; then
      run_tool ucmatose -b "$addr" -C "$count" $(opt -p "$port") $(opt -S "$size")
    else
      wait_peer
      run_client ucmatose -s "$peer" -b "$addr" -C "$count" $(opt -p "$port") $(opt -S "$size")
    fi
    show
    finish "$rc" "complete=$(ok_lines) attempts=$attempt"
    ;;
  ib_*-server|ib_*-client)
    tool=${role%-*}
    ok_lines() { grep -cE '^ *[0-9]+ +[0-9]+ +[0-9.]+' /tmp/out; }
    set -- -R -F -n "$count" $(opt -p "$port") $(opt -s "$size")
    if [ "${role##*-}" = server ]; then
      run_tool "$tool" "$@"
    else
      wait_peer
      run_client "$tool" "$@" "$peer"
    fi
    show
    # the table row: bytes iterations then bandwidth peak/average (MB/s) or latency columns
    row=$(grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' /tmp/out | tail -n 1 | tr -s ' ')
    [ -n "$row" ] || [ "$rc" != 0 ] || rc=1
    finish "$rc" "attempts=$attempt row=$(echo $row | tr ' ' ',')"
    ;;
  *)
    finish 2 error=unknown-role
    ;;
esac
