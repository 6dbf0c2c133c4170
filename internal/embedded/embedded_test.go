package embedded

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Configure's changes reach the server: here, it requires a password.
func TestConfigure(t *testing.T) {
	s, err := Start(Config{StoreDir: t.TempDir(), Configure: func(o *server.Options) {
		o.Username, o.Password = "app", "s3cret"
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if nc, err := nats.Connect(s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("connect without a password: %v, want %v", err, nats.ErrAuthorization)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

// Start fails at once, naming the cause, and the server's fatal error
// reaches the logger: here its monitoring port is taken.
func TestStartFailsAtOnce(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&syncWriter{w: &logged}, nil))

	for _, tc := range []struct {
		name string
		cfg  Config
		want error  // nil: any error
		msg  string // in the error
	}{
		{"client port taken", Config{StoreDir: t.TempDir(), Port: port}, ErrPortInUse, "address already in use"},
		{"store is a file", Config{StoreDir: file}, ErrStoreDir, "is not a directory"},
		{"store under a file", Config{StoreDir: filepath.Join(file, "sub")}, ErrStoreDir, "not a directory"},
		{"monitoring port taken", Config{StoreDir: t.TempDir(), Logger: logger, Configure: func(o *server.Options) {
			o.HTTPHost, o.HTTPPort = "127.0.0.1", port
		}}, nil, "Can't start monitoring"},
	} {
		start := time.Now()
		s, err := Start(tc.cfg)
		took := time.Since(start)
		if err == nil {
			s.Shutdown()
			t.Errorf("%s: Start succeeded", tc.name)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.want, tc.msg)
		}
		if took > time.Second {
			t.Errorf("%s: failed after %v, want under 1s", tc.name, took)
		}
	}
	if !strings.Contains(logged.String(), "Can't start monitoring") || !strings.Contains(logged.String(), "component=nats-server") {
		t.Errorf("the server's fatal error is not in the log:\n%s", logged.String())
	}
}

// A second server on a store in use is refused with the holder's pid; the
// store is free again after Shutdown.
func TestStoreLocked(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(Config{StoreDir: dir, NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Start(Config{StoreDir: dir, NoListen: true})
	if !errors.Is(err, ErrStoreLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("second server on %s: %v, want %v naming pid %d", dir, err, ErrStoreLocked, os.Getpid())
	}
	s.Shutdown()
	s, err = Start(Config{StoreDir: dir, NoListen: true})
	if err != nil {
		t.Fatalf("start after Shutdown: %v", err)
	}
	s.Shutdown()
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
