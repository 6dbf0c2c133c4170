package itest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetorder/jetorder/internal/testutil"
)

// Process is a child process whose stderr is kept.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    *testutil.LogBuffer
}

// StartProcess runs bin with args, env added to the test's environment,
// calling line (if not nil) with each line it writes to stderr, from a
// goroutine of its own. When the test ends the process is killed; a data
// race it reported fails the test, and with JETORDER_TEST_LOG=1 a failed
// test logs its stderr.
func StartProcess(t testing.TB, bin string, args, env []string, line func(string)) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{cmd: cmd, exited: make(chan struct{}), log: &testutil.LogBuffer{}}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			_, _ = p.log.Write([]byte(sc.Text() + "\n"))
			if line != nil {
				line(sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.Kill()
		if strings.Contains(p.log.String(), "DATA RACE") {
			t.Errorf("%s reported a data race:\n%s", filepath.Base(bin), p.log.String())
		}
		if t.Failed() && os.Getenv("JETORDER_TEST_LOG") != "" {
			t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), p.log.String())
		}
	})
	return p
}

// Signal sends sig without waiting for its effect.
func (p *Process) Signal(sig os.Signal) { _ = p.cmd.Process.Signal(sig) }

// Kill sends SIGKILL and waits until the process is gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Terminate sends SIGTERM and waits up to timeout for the process to
// exit; it returns an error unless it exited 0 in time (then it is killed).
func (p *Process) Terminate(timeout time.Duration) error {
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if code := p.ExitCode(); code != 0 {
			return &exitError{code: code}
		}
		return nil
	case <-time.After(timeout):
		p.Kill()
		return &exitError{code: -1, after: timeout}
	}
}

type exitError struct {
	code  int
	after time.Duration
}

func (e *exitError) Error() string {
	if e.after > 0 {
		return "still running " + e.after.String() + " after SIGTERM"
	}
	return "exited with " + strconv.Itoa(e.code) + " after SIGTERM"
}

// Exited is closed once the process has exited and its stderr is read.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitCode is the exit code once Exited is closed (-1 when killed).
func (p *Process) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Log is what the process wrote to stderr so far.
func (p *Process) Log() string { return p.log.String() }

// BuildSidecar builds cmd/sidecar with the race detector into a temp dir
// and returns the binary's path (the test's own packages are built so
// already, so only linking is new work).
func BuildSidecar(t testing.TB) string {
	t.Helper()
	return build(t, "sidecar", "github.com/jetorder/jetorder/cmd/sidecar", "-race")
}

// BuildSidecarTagged builds the sidecar, with the race detector, with
// the build tags given (comma-separated): for a negative control that
// needs a check switched off at build time.
func BuildSidecarTagged(t testing.TB, tags string) string {
	t.Helper()
	return build(t, "sidecar-"+strings.ReplaceAll(tags, ",", "-"), "github.com/jetorder/jetorder/cmd/sidecar", "-race", "-tags", tags)
}

// BuildNATSServer builds the nats-server of go.mod into a temp dir and
// returns the binary's path.
func BuildNATSServer(t testing.TB) string {
	t.Helper()
	return build(t, "nats-server", "github.com/nats-io/nats-server/v2")
}

func build(t testing.TB, name, pkg string, flags ...string) string {
	t.Helper()
	goBin := goBinary()
	bin := filepath.Join(t.TempDir(), name)
	args := append(append([]string{"build"}, flags...), "-o", bin, pkg)
	if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// goBinary is the go command: on the PATH, or the one that built the test.
func goBinary() string {
	if goBin, err := exec.LookPath("go"); err == nil {
		return goBin
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
