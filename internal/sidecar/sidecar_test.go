package sidecar

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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

// A sidecar that cannot start says why at once, naming the flag to change.
func TestStartupFailures(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	invalid, refused := filepath.Join(t.TempDir(), "invalid.yaml"), filepath.Join(t.TempDir(), "refused.yaml")
	for f, content := range map[string]string{
		invalid: "projects: {p: {topics: {orders: {retention: 1h}}}}\n",
		refused: "projects:\n  p:\n    topics: {orders: {}}\n    subscriptions:\n      orders-sub: {topic: orders, ackDeadlineSeconds: 900}\n",
	} {
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	shared := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		first <- Run(ctx, Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", DataDir: shared}, nil, func(Listening) { close(ready) })
	}()
	defer func() {
		cancel()
		if err := <-first; err != nil {
			t.Errorf("first sidecar: %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-first:
		t.Fatalf("first sidecar: %v", err)
	}

	cases := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"NATS port taken", Config{DataDir: t.TempDir(), NATSListen: taken.Addr().String()}, []string{"--nats-listen", "address already in use"}},
		{"data dir is a file", Config{DataDir: file}, []string{"--data-dir", "is not a directory"}},
		{"second sidecar on a data dir", Config{DataDir: shared}, []string{"--data-dir", "held by pid " + strconv.Itoa(os.Getpid())}},
		{"resources file not valid", Config{DataDir: t.TempDir(), Resources: invalid}, []string{"--resources", invalid + `:1: topic "orders": unknown field "retention"`}},
		{"resources the API refuses", Config{DataDir: t.TempDir(), Resources: refused},
			[]string{"--resources", refused + `:5: subscription "orders-sub": create: subscription projects/p/subscriptions/orders-sub: ack_deadline_seconds 900 not in 0..600 (InvalidArgument)`}},
	}
	if os.Geteuid() != 0 { // root writes anywhere
		readOnly := t.TempDir()
		if err := os.Chmod(readOnly, 0o500); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			name string
			cfg  Config
			want []string
		}{"data dir not writable", Config{DataDir: readOnly}, []string{"--data-dir", "is not writable"}})
	}
	for _, tc := range cases {
		tc.cfg.GRPCAddr, tc.cfg.HTTPAddr = "127.0.0.1:0", "off"
		start := time.Now()
		err := Run(context.Background(), tc.cfg, nil, func(Listening) { t.Errorf("%s: the sidecar started", tc.name) })
		took := time.Since(start)
		if err == nil {
			t.Errorf("%s: Run returned no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q, want it to say %q", tc.name, err, w)
			}
		}
		if took > time.Second {
			t.Errorf("%s: failed after %v, want under 1s", tc.name, took)
		}
	}
}
