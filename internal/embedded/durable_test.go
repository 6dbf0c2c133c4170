package embedded

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/jetorder/jetorder/internal/powercut"
)

// The group syncer makes what was written before Sync survive a power cut,
// through every kind of change the server makes: appends, new files, new
// directories, files replaced by rename. Without Sync (the control) the
// same writes are lost, so the harness drops what it should.
func TestGroupSyncSurvivesPowerCut(t *testing.T) {
	if err := powercut.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("needs FUSE as root: %v", err)
		}
		t.Skipf("needs FUSE as root: %v", err)
	}
	for _, synced := range []bool{true, false} {
		t.Run("synced="+strconv.FormatBool(synced), func(t *testing.T) {
			backing, mnt := t.TempDir(), t.TempDir()
			fs, err := powercut.Mount(backing, mnt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fs.Close() })
			// The store through a symbolic link, and a directory of
			// someone else's beside the server's tree (a volume's
			// lost+found): neither may stop the rounds.
			link := filepath.Join(t.TempDir(), "store")
			if err := os.Symlink(mnt, link); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(mnt, "lost+found"), 0); err != nil {
				t.Fatal(err)
			}
			g, err := newGroupSyncer(link)
			if err != nil {
				t.Fatal(err)
			}
			write := func(name, data string, appendTo bool) {
				t.Helper()
				flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
				if appendTo {
					flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
				}
				p := filepath.Join(mnt, "jetstream", name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				f, err := os.OpenFile(p, flags, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteString(data); err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			}
			// A round before anything: no jetstream/ yet, nothing to do.
			if err := g.sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			write("streams/a/msgs/1.blk", "first", true)
			if err := g.sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			// Changes after a round: an append, a new file in a new
			// directory, a file replaced by rename.
			write("streams/a/msgs/1.blk", "+second", true)
			write("streams/b/meta.inf", "b", false)
			write("streams/a/meta.inf.tmp", "a2", false)
			if err := os.Rename(filepath.Join(mnt, "jetstream/streams/a/meta.inf.tmp"), filepath.Join(mnt, "jetstream/streams/a/meta.inf")); err != nil {
				t.Fatal(err)
			}
			if synced {
				// Concurrent callers all return once a round covered them.
				var wg sync.WaitGroup
				errs := make(chan error, 8)
				for range 8 {
					wg.Go(func() { errs <- g.sync(context.Background()) })
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := fs.Cut(); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"streams/a/msgs/1.blk": "first+second", "streams/b/meta.inf": "b", "streams/a/meta.inf": "a2"}
			if !synced {
				want = map[string]string{"streams/a/msgs/1.blk": "first", "streams/b/meta.inf": "", "streams/a/meta.inf": ""}
			}
			for name, w := range want {
				got, err := os.ReadFile(filepath.Join(mnt, "jetstream", name))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, []byte(w)) {
					t.Errorf("after the cut %s holds %q, want %q", name, got, w)
				}
			}
		})
	}
}
