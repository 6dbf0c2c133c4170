// Package testutil starts real nats-servers for tests and waits for
// conditions by polling, never by sleeping a fixed time.
package testutil

import (
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/internal/embedded"
)

// Server starts a JetStream nats-server on a random loopback port with its
// store in a temporary directory, and stops it when the test ends.
func Server(t testing.TB) *embedded.Server {
	t.Helper()
	return ServerAt(t, t.TempDir(), -1)
}

// ServerAt starts a server on the given store dir and port (-1: random).
func ServerAt(t testing.TB, dir string, port int) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Config{StoreDir: dir, Port: port})
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Connect opens a connection to url that reconnects forever, closed when the
// test ends.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.ReconnectBufSize(-1), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Eventually polls cond every 10ms until it is true or timeout passes, and
// fails the test with msg if it never is. An argument that is a function of
// no arguments and one result is called when the message is written, so it
// shows the state at the failure. Call Eventually on the test goroutine.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	if Poll(timeout, cond) {
		return
	}
	for i, a := range args {
		if v := reflect.ValueOf(a); v.Kind() == reflect.Func && v.Type().NumIn() == 0 && v.Type().NumOut() == 1 {
			args[i] = v.Call(nil)[0].Interface()
		}
	}
	t.Fatalf("after %v: "+msg, append([]any{timeout}, args...)...)
}

// Poll polls cond every 10ms until it is true or timeout passes, and
// reports whether it became true: for waits whose failure the caller
// reports itself.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
