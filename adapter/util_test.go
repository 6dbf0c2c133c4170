package adapter

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

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
	t0 := time.Unix(1_800_000_000, 0)
	var at time.Duration
	w := rareWarning{now: func() time.Time { return t0.Add(at) }}
	// A warning every second of a 25 s outage: lines at 0 s, 10 s and
	// 20 s, each after the first counting the 9 in between; flush reports
	// the last 4 (21-24 s).
	for at = 0; at < 25*time.Second; at += time.Second {
		w.warn(log, "ack not sent", "n", int(at/time.Second))
	}
	w.flush(log)
	w.flush(log) // nothing more
	want := []string{
		"n=0",
		"n=10 not_logged_since_last=9",
		"n=20 not_logged_since_last=9",
		"n=24 not_logged_since_last=4",
	}
	lines := buf.Lines()
	if len(lines) != len(want) {
		t.Fatalf("logged %d lines, want %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	for i, line := range lines {
		if !strings.HasSuffix(line, `msg="ack not sent" `+want[i]) {
			t.Errorf("line %d = %q, want it to end with %q", i, line, want[i])
		}
	}
}

// retryUntil asks again after an attempt that goes unanswered, returns a
// lasting error at once, and stops when its context ends.
func TestRetryUntil(t *testing.T) {
	c := &Client{cfg: clientConfig{apiTimeout: 10 * time.Second}}
	attempts := 0
	err := c.retryUntil(context.Background(), func(ctx context.Context) error {
		attempts++
		if attempts == 1 {
			<-ctx.Done() // a request the cluster dropped
			return ctx.Err()
		}
		return nil
	})
	if err != nil || attempts != 2 {
		t.Fatalf("an unanswered attempt then an answer: err %v after %d attempts, want nil after 2", err, attempts)
	}

	// Each attempt may take twice as long as the one before, up to the
	// API timeout: a slow cluster's answer is waited for in the end.
	var bounds []time.Duration
	err = c.retryUntil(context.Background(), func(ctx context.Context) error {
		d, _ := ctx.Deadline()
		bounds = append(bounds, time.Until(d).Round(time.Second))
		if len(bounds) < 5 {
			return context.DeadlineExceeded
		}
		return nil
	})
	if want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}; err != nil || !slices.Equal(bounds, want) {
		t.Fatalf("attempts bounded by %v (err %v), want %v", bounds, err, want)
	}

	attempts = 0
	lasting := &jetstream.APIError{Code: 400, Description: "bad request"}
	err = c.retryUntil(context.Background(), func(context.Context) error { attempts++; return lasting })
	if err != lasting || attempts != 1 {
		t.Fatalf("a lasting error: %v after %d attempts, want it after 1", err, attempts)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	attempts = 0
	unavailable := &jetstream.APIError{Code: 503, Description: "unavailable"}
	err = c.retryUntil(ctx, func(context.Context) error { attempts++; return unavailable })
	if err != unavailable || attempts < 2 || ctx.Err() == nil {
		t.Fatalf("unavailable until the context ends: %v after %d attempts (context %v), want it after several, the context ended", err, attempts, ctx.Err())
	}
}
