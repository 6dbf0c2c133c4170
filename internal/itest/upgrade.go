package itest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Releases are the earlier commits of this repository that the upgrade
// tests (integration/upgrade) start from: main as of the layout record's
// introduction, and every later commit that changes the storage layout
// (docs/WIRE.md). Add a commit here with each layout change.
var Releases = []Release{
	{Commit: "5522428e11fe83c282eb9001df66054f3692db2e", Layout: 1, Note: "main of 2026-11-29, before the layout record (layout 2's streams and records, unversioned)", SlowPerKeyStop: true},
}

// A Release is an earlier build the upgrade tests run.
type Release struct {
	Commit string
	Layout int // the layout it leaves (adapter.AccountLayout); 1: no record (it predates it)
	Note   string
	// SlowPerKeyStop: a per-key receiver that holds its subscription's
	// key discovery may take the client's API timeout (10 s) to stop,
	// more than the sidecar's default shutdown timeout (fixed after
	// 5522428: adapter/discovery.go).
	SlowPerKeyStop bool
}

// Short is the commit's first 7 hex digits.
func (r Release) Short() string { return r.Commit[:7] }

var buildMu sync.Mutex

// BuildSidecarAt builds the sidecar of an earlier commit of this
// repository (without the race detector) and returns the binary's path.
// Binaries are kept in the user's cache directory by commit, so a second
// run reuses them. The commit must be in the clone's history: a shallow
// clone fails the test, saying so.
func BuildSidecarAt(t testing.TB, commit string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "jetorder-test", "sidecar-"+commit)
	bin := filepath.Join(dir, "sidecar")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse --show-toplevel: %v (the upgrade tests build earlier commits from the repository's history)", err)
	}
	repo := strings.TrimSpace(string(top))
	if out, err := exec.Command("git", "-C", repo, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s is not in this clone's history (%v: %s): the upgrade tests build it; clone without --depth, or fetch it", commit, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(src)
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", repo, commit, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	tmp := bin + ".tmp"
	build := exec.Command(goBinary(), "build", "-o", tmp, "./cmd/sidecar")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the sidecar at %s: %v\n%s", commit, err, out)
	}
	// Renamed into place only once whole: another test process may look.
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}
