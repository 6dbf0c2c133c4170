package adapter

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/testutil"
)

// streamSeqs finds a filter's messages in a range in batches, across
// answers cut by their size, and by message gets where asked to.
func TestStreamSeqs(t *testing.T) {
	srv := testutil.Server(t)
	nc := testutil.Connect(t, srv.ClientURL())
	c, err := NewClient(nc, "p")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 100<<10) // ten make a batch's MiB
	var want []uint64
	for i := range 60 {
		subj, data := "s.b", big
		if i%3 == 0 {
			subj, data = "s.a", nil
		}
		ack, err := js.Publish(ctx, subj, data)
		if err != nil {
			t.Fatal(err)
		}
		if subj == "s.b" && ack.Sequence >= 5 && ack.Sequence <= 50 {
			want = append(want, ack.Sequence)
		}
	}
	// One answer holds a MiB: the first batch ends early, without the
	// fallback to message gets.
	if got, last, err := c.directBatch(ctx, "S", "s.b", 5, 100); err != nil || len(got) < 2 || len(got) >= len(want) || last != got[len(got)-1] {
		t.Fatalf("directBatch = %v, %d, %v; want a first part of %v", got, last, err, want)
	}
	for _, tc := range []struct {
		name  string
		limit int
		want  []uint64
	}{
		{"all", 1000, want},
		{"limited", 7, want[:7]},
	} {
		got, err := c.streamSeqs(ctx, "S", "s.b", 5, 50, tc.limit)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: streamSeqs = %v, %v; want %v", tc.name, got, err, tc.want)
		}
		got, err = c.leaderSeqs(ctx, "S", "s.b", 5, 50, tc.limit, nil)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: leaderSeqs = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if got, err := c.streamSeqs(ctx, "S", "s.none", 1, 60, 10); err != nil || len(got) != 0 {
		t.Errorf("no such subject: %v, %v", got, err)
	}
}

func TestRareWarningLogsOncePerInterval(t *testing.T) {
	var buf testutil.LogBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var w rareWarning
	for range 5 {
		w.warn(log, "ack not sent", "subscription", "s")
	}
	if lines := buf.Lines(); len(lines) != 1 || strings.Contains(lines[0], "not_logged_since_last") {
		t.Fatalf("5 warnings within the interval logged %q, want one line without a count", lines)
	}
	w.mu.Lock()
	w.last = w.last.Add(-rareWarningInterval) // the interval has passed
	w.mu.Unlock()
	w.warn(log, "ack not sent", "subscription", "s")
	lines := buf.Lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "not_logged_since_last=4") {
		t.Fatalf("the warning after the interval logged %q, want a second line counting the 4 not logged", lines)
	}
}
