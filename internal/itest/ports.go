package itest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// FreeAddr is a loopback host:port free now, for a server that must come
// back on the same port after a restart. The port stays the caller's until
// its test ends.
//
// The port is below the kernel's ephemeral range: a port from that range
// (what listening on port 0 gives) may be taken, while the server is down,
// by any outgoing connection or port-0 listener of the parallel test
// packages, and the restart then fails with "address already in use".
// Below the range only another FreeAddr could take it, and FreeAddr claims
// each port it gives (see claimPort), so no other test, in this process or
// another, gets it while its server is down.
func FreeAddr(t testing.TB) string {
	t.Helper()
	low := ephemeralLow()
	const floor = 10000
	for range 1000 {
		port := floor + rand.IntN(low-floor)
		release, ok := claimPort(port)
		if !ok {
			continue
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			release()
			continue
		}
		l.Close()
		t.Cleanup(release)
		return addr
	}
	t.Fatal(fmt.Errorf("itest: no free port in [%d, %d) after 1000 tries", floor, low))
	return ""
}

// claimPort claims port for this process with an exclusive lock on a file
// named for it, in a directory shared by the test packages go test runs at
// once. The kernel drops the lock when the process ends, however it ends,
// so a claim never outlives its process. Files stay: removing one could
// let two processes lock two different files of the same name.
func claimPort(port int) (release func(), ok bool) {
	dir := filepath.Join(os.TempDir(), "jetorder-itest-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, false
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, false
	}
	// Locks of two open files conflict even within one process.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default where it cannot be read).
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return linuxDefault
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 10000+1000 {
		return linuxDefault
	}
	return n
}
