package sidecar

import (
	"net"
	"testing"
)

func TestRedactURLs(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                    "nats://127.0.0.1:4222",
		"nats://app:s3cret@host:4222":              "nats://app:xxxxx@host:4222",
		"tls://t0ken@host:4222":                    "tls://xxxxx@host:4222",
		"app:s3cret@host:4222":                     "nats://app:xxxxx@host:4222",
		"nats://a:p1@h1:4222, nats://a:p2@h2:4222": "nats://a:xxxxx@h1:4222,nats://a:xxxxx@h2:4222",
		"nats://a:p%zz@host":                       "(invalid URL)",
	} {
		if got := redactURLs(in); got != want {
			t.Errorf("redactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBeyondLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1": false, "127.1.2.3:1": false, "[::1]:1": false,
		"0.0.0.0:1": true, "[::]:1": true, "192.0.2.1:1": true,
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := beyondLoopback(a); got != want {
			t.Errorf("beyondLoopback(%s) = %v, want %v", addr, got, want)
		}
	}
}
