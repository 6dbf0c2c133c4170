package powercut

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// mountpoints lists every mount made by the tests, so TestMain can check
// that none is left behind.
var (
	mountpointsMu sync.Mutex
	mountpoints   []string
)

func TestMain(m *testing.M) {
	code := m.Run()
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		fmt.Fprintln(os.Stderr, "reading /proc/mounts:", err)
		os.Exit(1)
	}
	for line := range strings.Lines(string(mounts)) {
		fields := strings.Fields(line)
		for _, mp := range mountpoints {
			if len(fields) > 1 && fields[1] == mp {
				fmt.Fprintln(os.Stderr, "mount left behind:", strings.TrimSpace(line))
				code = 1
			}
		}
	}
	os.Exit(code)
}

// mount mounts a fresh backing directory, first filled with prefill, and
// returns the file system and its mount point.
func mount(t *testing.T, prefill map[string][]byte) (*FS, string) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("cannot mount FUSE here (CI runs these as root): %v", err)
	}
	backing, mnt := t.TempDir(), t.TempDir()
	for name, data := range prefill {
		if err := os.WriteFile(filepath.Join(backing, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Mount(backing, mnt)
	if err != nil {
		t.Fatal(err)
	}
	mountpointsMu.Lock()
	mountpoints = append(mountpoints, mnt)
	mountpointsMu.Unlock()
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f, mnt
}

func randBytes(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

func cut(t *testing.T, f *FS) Stats {
	t.Helper()
	stats, err := f.Cut()
	if err != nil {
		t.Fatalf("Cut: %v", err)
	}
	return stats
}

func wantContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: got %d bytes, want %d bytes; equal prefix %d", path, len(got), len(want), commonPrefix(got, want))
	}
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func writeAt(t *testing.T, file *os.File, data []byte, off int64) {
	t.Helper()
	if _, err := file.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

func TestCutRestoresSyncedContent(t *testing.T) {
	f, mnt := mount(t, nil)
	path := filepath.Join(mnt, "data")
	synced := randBytes(1, 10000) // pages [0,4096) [4096,8192) [8192,10000)

	file, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	writeAt(t, file, synced, 0)
	if err := file.Sync(); err != nil {
		t.Fatal(err)
	}
	writeAt(t, file, randBytes(2, 2000), 4000) // dirties pages 0 and 1
	writeAt(t, file, randBytes(3, 6000), 9000) // dirties page 2, grows to 15000
	writeAt(t, file, randBytes(4, 100), 4050)  // page 0 again: its undo is kept
	// Read through the mount, so the kernel caches the unsynced bytes.
	if got, err := os.ReadFile(path); err != nil || len(got) != 15000 {
		t.Fatalf("before cut: %d bytes, %v", len(got), err)
	}
	file.Close()

	stats := cut(t, f)
	wantContent(t, path, synced)
	// Restored: pages 0 and 1 in full, page 2 up to the synced size
	// (4096+4096+1808); truncated away: 15000-10000.
	if want := (Stats{Files: 1, Bytes: 10000 + 5000}); stats != want {
		t.Errorf("Stats = %+v, want %+v", stats, want)
	}
}

func TestNeverSyncedFileIsEmptied(t *testing.T) {
	f, mnt := mount(t, nil)
	path := filepath.Join(mnt, "new")
	if err := os.WriteFile(path, randBytes(1, 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	stats := cut(t, f)
	wantContent(t, path, []byte{})
	if want := (Stats{Files: 1, Bytes: 5000}); stats != want {
		t.Errorf("Stats = %+v, want %+v", stats, want)
	}
}

func TestFileUntouchedSinceMountCountsAsSynced(t *testing.T) {
	old := randBytes(1, 6000)
	f, mnt := mount(t, map[string][]byte{"old": old})
	path := filepath.Join(mnt, "old")
	if err := os.WriteFile(path, randBytes(2, 9000), 0o644); err != nil { // truncates, then writes
		t.Fatal(err)
	}
	cut(t, f)
	wantContent(t, path, old)
}

func TestOSyncWritesSurvive(t *testing.T) {
	f, mnt := mount(t, nil)
	path := filepath.Join(mnt, "meta")
	data := randBytes(1, 7000)
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_SYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, file, data[:3000], 0)
	writeAt(t, file, data[3000:], 3000)
	if err := file.Close(); err != nil {
		t.Fatal(err)
	}
	if stats := cut(t, f); stats != (Stats{}) {
		t.Errorf("Stats = %+v, want none", stats)
	}
	wantContent(t, path, data)
}

func TestAtomicRename(t *testing.T) {
	f, mnt := mount(t, nil)
	tmp, name := filepath.Join(mnt, "meta.tmp"), filepath.Join(mnt, "meta")

	// Synced write then rename: survives.
	durable := randBytes(1, 300)
	file, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_SYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, file, durable, 0)
	file.Close()
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	wantContent(t, name, durable)

	// The lazy pattern: no sync before the rename. The rename is durable,
	// the data is not, so the name survives and is empty.
	if err := os.WriteFile(tmp, randBytes(2, 400), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	wantContent(t, name, []byte{})
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("%s after cut: %v, want not exist", tmp, err)
	}
}

func TestTruncateIsUndone(t *testing.T) {
	f, mnt := mount(t, nil)
	path := filepath.Join(mnt, "data")
	synced := randBytes(1, 3*pageSize+10)
	file, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, file, synced, 0)
	if err := file.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := file.Truncate(5000); err != nil { // through the handle
		t.Fatal(err)
	}
	file.Close()
	if err := os.Truncate(path, 100); err != nil { // by path, no handle
		t.Fatal(err)
	}
	if err := os.Truncate(path, 20000); err != nil { // grows it with zeros
		t.Fatal(err)
	}

	stats := cut(t, f)
	wantContent(t, path, synced)
	// All 12298 synced bytes restored, 20000-12298 truncated away.
	if want := (Stats{Files: 1, Bytes: 20000}); stats != want {
		t.Errorf("Stats = %+v, want %+v", stats, want)
	}
}

func TestSecondCutRollsBackNothing(t *testing.T) {
	f, mnt := mount(t, nil)
	path := filepath.Join(mnt, "data")
	if err := os.WriteFile(path, randBytes(1, 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	if stats := cut(t, f); stats.Files != 1 {
		t.Fatalf("first Stats = %+v, want 1 file", stats)
	}
	if stats := cut(t, f); stats != (Stats{}) {
		t.Errorf("second Stats = %+v, want none", stats)
	}
	wantContent(t, path, []byte{})
}

func TestUnlinkAndRenameOverDropState(t *testing.T) {
	f, mnt := mount(t, nil)
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, randBytes(1, 5000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(a, b); err != nil { // drops b's state
		t.Fatal(err)
	}
	if err := os.Remove(b); err != nil { // drops a's state
		t.Fatal(err)
	}
	if stats := cut(t, f); stats != (Stats{}) {
		t.Errorf("Stats = %+v, want none", stats)
	}
}

func TestCutRefusesWhileFileOpen(t *testing.T) {
	f, mnt := mount(t, nil)
	file, err := os.Create(filepath.Join(mnt, "open"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Cut(); err == nil {
		t.Fatal("Cut with an open file succeeded, want an error")
	}
	file.Close()
	if stats := cut(t, f); stats != (Stats{}) {
		t.Errorf("Stats = %+v, want none", stats)
	}
}

func TestConcurrentWritersHalfSynced(t *testing.T) {
	f, mnt := mount(t, nil)
	const nFiles, writersPerFile, writesPerWriter = 8, 4, 50
	const baseSize = 64 << 10

	files := make([]*os.File, nFiles)
	base := make([][]byte, nFiles)
	for i := range files {
		var err error
		files[i], err = os.Create(filepath.Join(mnt, fmt.Sprint("f", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer files[i].Close()
		base[i] = randBytes(uint64(i), baseSize)
		writeAt(t, files[i], base[i], 0)
		if err := files[i].Sync(); err != nil {
			t.Fatal(err)
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, nFiles*writersPerFile)
	for i := range files {
		for w := range writersPerFile {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for range writesPerWriter {
					data := randBytes(r.Uint64(), 1+r.IntN(3*pageSize))
					off := r.Int64N(baseSize + baseSize/2) // overwrites and appends
					if _, err := files[i].WriteAt(data, off); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	want := make([][]byte, nFiles)
	for i, file := range files {
		if i%2 == 0 {
			if err := file.Sync(); err != nil {
				t.Fatal(err)
			}
			var err error
			if want[i], err = os.ReadFile(file.Name()); err != nil {
				t.Fatal(err)
			}
		} else {
			want[i] = base[i]
		}
		file.Close()
	}

	stats := cut(t, f)
	for i, file := range files {
		wantContent(t, file.Name(), want[i])
	}
	if stats.Files != nFiles/2 {
		t.Errorf("Stats = %+v, want %d files", stats, nFiles/2)
	}
}
