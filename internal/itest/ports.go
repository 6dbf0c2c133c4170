package itest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreeAddr is a loopback host:port free now, for a server that must come
// back on the same port after a restart.
//
// The port is below the kernel's ephemeral range: a port from that range
// (what listening on port 0 gives) may be taken, while the server is down,
// by any outgoing connection or port-0 listener of the parallel test
// packages, and the restart then fails with "address already in use".
// Below the range only another FreeAddr can take it, at random.
func FreeAddr(t testing.TB) string {
	t.Helper()
	low := ephemeralLow()
	const floor = 10000
	for range 200 {
		addr := "127.0.0.1:" + strconv.Itoa(floor+rand.IntN(low-floor))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		return addr
	}
	t.Fatal(fmt.Errorf("itest: no free port in [%d, %d) after 200 tries", floor, low))
	return ""
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
