package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/internal/testutil"
)

func TestVersion(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, tc := range []struct {
		name           string
		bi             *debug.BuildInfo
		linked         string // by -ldflags -X main.commit
		module, commit string
	}{
		{name: "go install at a tag", bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}},
			module: "v1.2.3", commit: "unknown"},
		{name: "go install between tags", bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.4-0.20261125153000-fea373c2d2e6"}},
			module: "v1.2.4-0.20261125153000-fea373c2d2e6", commit: "fea373c2d2e6 (from the version)"},
		{name: "go build in a clean clone", bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261125153000-fea373c2d2e6"},
			Settings: vcs("fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e", "false")},
			module: "v0.0.0-20261125153000-fea373c2d2e6", commit: "fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e"},
		{name: "go build with changes", bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261125153000-fea373c2d2e6+dirty"},
			Settings: vcs("fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e", "true")},
			module: "v0.0.0-20261125153000-fea373c2d2e6+dirty", commit: "fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e (modified)"},
		{name: "go run", bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, module: "(devel)", commit: "unknown"},
		{name: "make build in a worktree", bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			linked: "fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e-modified", module: "(devel)", commit: "fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e-modified"},
		{name: "go's record wins", bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261125153000-fea373c2d2e6"},
			Settings: vcs("fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e", "false")}, linked: "something else",
			module: "v0.0.0-20261125153000-fea373c2d2e6", commit: "fea373c2d2e6a1b2c3d4e5f60718293a4b5c6d7e"},
		{name: "no build information", module: "(unknown)", commit: "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := version(tc.bi, tc.linked)
			for _, want := range []string{
				"jetorder sidecar " + tc.module + "\n",
				"commit " + tc.commit + "\n",
				"nats-server v" + server.VERSION + "\n",
			} {
				if !strings.Contains(got, want) {
					t.Errorf("version() =\n%s\nwant a line %q", got, want)
				}
			}
		})
	}
}

// --version and -h print to stdout and exit 0, starting nothing.
func TestRunVersionAndHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--version"}, []string{"jetorder sidecar ", "\ncommit ", "\nnats-server v" + server.VERSION + "\n"}},
		{[]string{"-h"}, []string{"Usage: sidecar [flags]", "JETORDER_<FLAG>", "-log-format", "-version"}},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tc.args, &stdout, &stderr, nil); code != 0 {
				t.Errorf("exit code %d, want 0", code)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout:\n%s\nwant it to hold %q", stdout.String(), w)
				}
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr: %q, want nothing", stderr.String())
			}
		})
	}
}

// A bad command line says what is wrong once, on stderr, and exits 2.
func TestRunBadFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{"bad value", []string{"--max-streams", "many"}, `--max-streams "many": want a positive integer`},
		{"bad log format", []string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{"bad log level", []string{"--log-level", "loud"}, `--log-level "loud"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// The flag package writes to os.Stderr unless told otherwise:
			// what goes there counts too.
			osStderr := captureStderr(t)
			code := run(context.Background(), tc.args, &stdout, &stderr, nil)
			stderr.WriteString(osStderr())
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if n := strings.Count(stderr.String(), tc.want); n != 1 {
				t.Errorf("stderr:\n%s\nholds %q %d times, want once", stderr.String(), tc.want, n)
			}
			if strings.Contains(stderr.String(), "Usage") || stdout.Len() != 0 {
				t.Errorf("stdout %q, stderr %q: want the error and a hint, not the usage", stdout.String(), stderr.String())
			}
		})
	}
}

// A --resources file that is not valid is reported on stderr, each
// problem with its line, and the sidecar exits 2 before it starts
// anything (no data dir is made); a missing file likewise.
func TestRunBadResources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "resources.yaml")
	if err := os.WriteFile(file, []byte("projects:\n  p:\n    subscriptions:\n      orders:\n        ackDeadline: 10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"invalid", file, []string{file + `:4: subscription "orders": missing field "topic"`, file + `:5: subscription "orders": unknown field "ackDeadline"`}},
		{"missing", filepath.Join(dir, "none.yaml"), []string{"no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			data := filepath.Join(dir, "data-"+tc.name)
			code := run(context.Background(), []string{"--resources", tc.file, "--data-dir", data}, &stdout, &stderr, nil)
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr:\n%s\nwant %q", stderr.String(), w)
				}
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				t.Errorf("data dir: %v, want none made", err)
			}
		})
	}
}

// With --log-format json every line on stderr is a JSON object: the
// sidecar's own, the embedded nats-server's (here a warning about a
// malformed JetStream API request, sent to the --nats-listen port), and
// with --log-level debug a line per HTTP request.
func TestRunJSONLog(t *testing.T) {
	var stderr testutil.LogBuffer
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"--log-format", "json", "--log-level", "debug", "--data-dir", t.TempDir(),
			"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}, &bytes.Buffer{}, &stderr, nil)
	}()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-exited
		}
	}()

	// find returns the first JSON line for which match is true; it fails
	// the test at a line that is not JSON.
	find := func(match func(map[string]any) bool) map[string]any {
		for _, line := range stderr.Lines() {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("not a JSON line: %q: %v", line, err)
			}
			if match(m) {
				return m
			}
		}
		return nil
	}
	var listening map[string]any
	testutil.Eventually(t, 15*time.Second, func() bool {
		select {
		case code := <-exited:
			stopped = true
			t.Fatalf("run exited with %d:\n%s", code, stderr.String())
		default:
		}
		listening = find(func(m map[string]any) bool { return m["msg"] == "jetorder sidecar listening" })
		return listening != nil
	}, "no listening line:\n%s", stderr.String)

	nc, err := nats.Connect(listening["nats_listen"].(string))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("$JS.API.STREAM.CREATE.bad", []byte("{not json"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return find(func(m map[string]any) bool {
			return m["level"] == "WARN" && m["component"] == "nats-server" && strings.Contains(m["msg"].(string), "Invalid JetStream request")
		}) != nil
	}, "no nats-server warning:\n%s", stderr.String)

	resp, err := http.Get("http://" + listening["http"].(string) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testutil.Eventually(t, 10*time.Second, func() bool {
		return find(func(m map[string]any) bool {
			return m["level"] == "DEBUG" && m["msg"] == "http request" && m["path"] == "/healthz" && m["status"] == float64(200)
		}) != nil
	}, "no debug line for GET /healthz:\n%s", stderr.String)

	cancel()
	stopped = true
	if code := <-exited; code != 0 {
		t.Errorf("exit code %d after shutdown, want 0", code)
	}
	if find(func(m map[string]any) bool { return m["msg"] == "stopped" }) == nil {
		t.Errorf("no stopped line:\n%s", stderr.String())
	}
}

// captureStderr sends what is written to os.Stderr to a pipe until the
// returned function is called, which returns it.
func captureStderr(t *testing.T) func() string {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		read <- string(b)
	}()
	restored := false
	restore := func() string {
		if restored {
			return ""
		}
		restored = true
		os.Stderr = saved
		w.Close()
		s := <-read
		r.Close()
		return s
	}
	t.Cleanup(func() { restore() })
	return restore
}
