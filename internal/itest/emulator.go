package itest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/jetorder/jetorder/internal/testutil"
)

// Google's official Pub/Sub emulator (the Debian package
// google-cloud-cli-pubsub-emulator, what `gcloud beta emulators pubsub
// start` runs): one process per test binary, started by the first test
// that asks for it and stopped by StopEmulator. Tests share it, each in a
// project of its own.

// emulatorScript is the emulator's start script below the Cloud SDK's
// root.
const emulatorScript = "platform/pubsub-emulator/bin/cloud-pubsub-emulator"

var emulator struct {
	once     sync.Once
	cmd      *exec.Cmd
	addr     string
	err      error // why there is none
	projects atomic.Int64
}

// EmulatorScript is the emulator's start script: $JETORDER_PUBSUB_EMULATOR,
// or the one beside the gcloud on PATH; an error says what is missing.
func EmulatorScript() (string, error) {
	if s := os.Getenv("JETORDER_PUBSUB_EMULATOR"); s != "" {
		return s, nil
	}
	gcloud, err := exec.LookPath("gcloud")
	if err != nil {
		return "", fmt.Errorf("gcloud is not installed, nor is Google's Pub/Sub emulator (apt-get install google-cloud-cli-pubsub-emulator, or set JETORDER_PUBSUB_EMULATOR to its start script)")
	}
	if gcloud, err = filepath.EvalSymlinks(gcloud); err != nil {
		return "", err
	}
	script := filepath.Join(filepath.Dir(filepath.Dir(gcloud)), emulatorScript)
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("Google's Pub/Sub emulator is not installed (apt-get install google-cloud-cli-pubsub-emulator): no %s", script)
	}
	if _, err := exec.LookPath("java"); err != nil {
		return "", fmt.Errorf("Google's Pub/Sub emulator needs java, which is not installed")
	}
	return script, nil
}

// Emulator is the address of the shared emulator and a project no other
// test uses, starting the emulator on first use. Without one the test is
// skipped, unless JETORDER_REQUIRE_EMULATOR=1 (CI), where it fails.
func Emulator(t testing.TB) (addr, project string) {
	t.Helper()
	emulator.once.Do(func() { emulator.addr, emulator.err = startEmulator() })
	if emulator.err != nil {
		if os.Getenv("JETORDER_REQUIRE_EMULATOR") == "1" {
			t.Fatalf("%v (JETORDER_REQUIRE_EMULATOR=1)", emulator.err)
		}
		t.Skip(emulator.err)
	}
	return emulator.addr, fmt.Sprintf("emulator-%d", emulator.projects.Add(1))
}

// EmulatorClient is Google's Go client of a project of its own on the
// shared emulator (Emulator), closed when the test ends.
func EmulatorClient(t testing.TB) *pubsub.Client {
	t.Helper()
	addr, project := Emulator(t)
	return GoClientOf(t, addr, project)
}

func startEmulator() (string, error) {
	addr, cmd, err := StartEmulator()
	emulator.cmd = cmd
	return addr, err
}

// StartEmulator starts a Google Pub/Sub emulator process on a free
// loopback port and waits until it serves: its host:port and the process,
// for the caller to kill.
func StartEmulator() (string, *exec.Cmd, error) {
	script, err := EmulatorScript()
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(script, "--host="+host, "--port="+port)
	log := &testutil.LogBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start Google's Pub/Sub emulator: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// The emulator answers "Ok" to a plain HTTP GET once it serves.
	deadline := time.Now().Add(60 * time.Second)
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := hc.Get("http://" + addr + "/")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if strings.TrimSpace(string(body)) == "Ok" {
				break
			}
		}
		select {
		case <-exited:
			return "", nil, fmt.Errorf("Google's Pub/Sub emulator exited at start:\n%s", log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return "", nil, fmt.Errorf("Google's Pub/Sub emulator did not serve within 60s:\n%s", log.String())
		}
	}
	return addr, cmd, nil
}

// StopEmulator stops the shared emulator, if one was started; a test
// binary's TestMain calls it after m.Run.
func StopEmulator() {
	if emulator.cmd != nil {
		_ = emulator.cmd.Process.Kill()
	}
}
