// Command soak runs constant ordered publish and receive with key churn for
// a bounded time and fails if the process's goroutines, heap, RSS or the
// server's consumers keep growing (see growth.go), if a message is lost,
// or if the per-key order of first deliveries breaks (internal/ordercheck
// sees every delivery).
//
// Keys come and go: message i goes to the i-th slot of a window of -active
// keys, and after each pass over the window the window slides on by
// active/per-key keys, so each key gets -per-key messages, one per pass,
// then goes quiet, and new keys keep appearing. Key consumers are therefore
// created and retired continuously. The key space (-keys) is finite and
// wraps: a key comes back only long after its consumer was retired, so the
// code under test sees it as new, while this program's own per-key
// bookkeeping (and the adapter's bounded subject cache) stays flat and any
// growth is the system's.
//
// One process runs everything: the embedded nats-server (file storage in a
// temp dir), the sidecar (or the library) and the clients.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/ordercheck"
)

var (
	duration = flag.Duration("duration", 3*time.Minute, "how long to publish (at least 30s)")
	rate     = flag.Int("rate", 500, "messages published per second")
	active   = flag.Int("active", 1000, "keys receiving messages at any time")
	perKey   = flag.Int("per-key", 4, "messages each key gets before it goes quiet")
	keySpace = flag.Int("keys", 5000, "distinct keys; the window wraps around them (at least 2x -active)")
	mode     = flag.String("mode", "sidecar", "sidecar (Google's Go client through the sidecar's gRPC API) or library")
	delivery = flag.String("delivery", "per-key", "delivery of the ordered subscription: per-key (consumers created and retired with the keys) or partitioned (key gates come and go in the partitions' owner)")
	idle     = flag.Duration("idle", 5*time.Second, "key idle timeout in library mode (the sidecar uses the adapter's default, 5s)")
	report   = flag.Duration("report", 10*time.Second, "print a row this often")
	drain    = flag.Duration("drain", 3*time.Minute, "after publishing stops, how long to wait for every message and then for every key consumer to be retired")
	heapProf = flag.String("heapprofile", "", "write a heap profile to this file when publishing stops")
	logLevel = flag.String("log", "warn", "log level of the sidecar or library to stderr: debug, info, warn, error or off")
)

// sampleEvery is how often the growth measures are sampled; the rows print
// the latest sample.
const sampleEvery = 2 * time.Second

func main() {
	flag.Parse()
	if err := validate(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	log, err := logger(*logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "jetorder-soak-")
	check(err)
	var t *target
	if *mode == "sidecar" {
		t, err = startSidecar(dir, log)
	} else {
		t, err = startLibrary(dir, *idle, log)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		check(err)
	}
	shift := max(1, *active / *perKey)
	fmt.Printf("jetorder soak: %s mode, %s delivery, %s, GOMAXPROCS=%d, file storage, one process (server embedded)\n",
		*mode, *delivery, runtime.Version(), runtime.GOMAXPROCS(0))
	fmt.Printf("%d msgs/s for %v over %d keys: %d active at a time, %d messages each, %.0f new keys/s; a key returns after %.0fs quiet\n\n",
		*rate, *duration, *keySpace, *active, *perKey, float64(*rate)*float64(shift)/float64(*active),
		float64(*keySpace-*active)/float64(shift)*float64(*active)/float64(*rate))

	s := &soak{t: t, chk: ordercheck.New(), counts: make([]int, *keySpace), next: map[string]int{}, keyLeft: -1}
	s.run(shift)
	t.close()
	_ = os.RemoveAll(dir) // before os.Exit, which runs no defers
	failures := s.verdict()
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Println("FAIL:", f)
		}
		os.Exit(1)
	}
	fmt.Println("PASS")
}

// run publishes for the duration, then waits for every message to be
// delivered and every key consumer to be retired, sampling throughout and
// printing a row every report interval.
func (s *soak) run(shift int) {
	rctx, stopReceive := context.WithCancel(context.Background())
	received := make(chan error, 1)
	go func() { received <- s.t.receive(rctx, s.handle) }()
	start := time.Now()
	pctx, stopPublish := context.WithCancel(context.Background())
	published := s.startPublishing(pctx, shift, start)

	fmt.Printf("%8s %-6s %10s %7s %10s %7s %8s %10s %11s %10s %8s %10s\n",
		"elapsed", "phase", "published", "pub/s", "delivered", "del/s", "backlog", "goroutines", "heap inuse", "heap live", "RSS", "consumers")
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	var last row
	nextRow := *report
	phase := "load"
	for phase != "done" {
		select {
		case err := <-received:
			s.failures = append(s.failures, fmt.Sprintf("receive ended early: %v", err))
			received <- err // for the shutdown below
			phase = "done"
			continue
		case <-tick.C:
		}
		elapsed := time.Since(start)
		smp := s.sample(elapsed)
		if phase == "load" {
			s.samples = append(s.samples, smp)
		}
		if elapsed >= nextRow {
			last = printRow(phase, smp, last)
			nextRow += *report
		}
		switch phase {
		case "load":
			if elapsed >= *duration {
				stopPublish()
				<-published
				phase, s.drainStart = "drain", time.Now()
				writeHeapProfile()
			}
		case "drain":
			if s.complete = s.chk.Complete(subID); s.complete {
				phase, s.retireStart = "retire", time.Now()
			} else if time.Since(s.drainStart) > *drain {
				phase = "done"
			}
		case "retire":
			left, err := s.t.keyConsumers(context.Background())
			if err == nil {
				s.keyLeft = left
			}
			if s.keyLeft == 0 {
				phase, s.retiredAt = "done", time.Now()
			} else if time.Since(s.retireStart) > *drain {
				phase = "done"
			}
		}
	}
	printRow(phase, s.sample(time.Since(start)), last)
	stopPublish()
	stopReceive()
	if err := <-received; err != nil && !errors.Is(err, context.Canceled) {
		s.failures = append(s.failures, fmt.Sprintf("receive: %v", err))
	}
}

// verdict prints the run's outcome and returns what failed.
func (s *soak) verdict() []string {
	failures := s.failures
	fmt.Println()
	st := s.chk.Stats(subID)
	fmt.Printf("published %d messages (%d publish errors); %d deliveries: %d first, %d of a message delivered before; %d acks\n",
		s.published.Load(), s.pubErrors.Load(), st.Deliveries, s.delivered.Load(), s.repeats.Load(), st.Acks)
	if n := s.pubErrors.Load(); n > 0 {
		failures = append(failures, fmt.Sprintf("%d publishes failed, first: %v", n, s.firstPubErr()))
	}
	switch {
	case s.complete:
		fmt.Printf("every published message delivered and acked %v after publishing stopped\n", s.retireStart.Sub(s.drainStart).Round(time.Second))
	case !s.drainStart.IsZero():
		failures = append(failures, fmt.Sprintf("not every message delivered within %v after publishing stopped: %s", *drain, s.chk.Missing(subID)))
	}
	if v := s.chk.Violations(); len(v) > 0 {
		failures = append(failures, fmt.Sprintf("ordering checker: %d violations (it keeps the first 50), first: %s", len(v), strings.Join(v[:min(len(v), 5)], "; ")))
	} else {
		fmt.Println("ordering checker: no violations (every delivery checked)")
	}
	switch {
	case s.keyLeft == 0:
		fmt.Printf("every key consumer retired %v after the last delivery\n", s.retiredAt.Sub(s.retireStart).Round(time.Second))
	case s.complete:
		failures = append(failures, fmt.Sprintf("%d key consumers still live %v after the last delivery", s.keyLeft, *drain))
	}
	return append(failures, judge(s.samples, *duration)...)
}

func validate() error {
	switch {
	case *duration < 30*time.Second:
		return fmt.Errorf("-duration %v: at least 30s, so the growth check has samples past the warm-up", *duration)
	case *rate < 1:
		return fmt.Errorf("-rate %d: at least 1", *rate)
	case *active < 1 || *perKey < 1:
		return fmt.Errorf("-active %d, -per-key %d: at least 1 each", *active, *perKey)
	case *perKey > *active:
		return fmt.Errorf("-per-key %d above -active %d: a key gets one message per pass over the window", *perKey, *active)
	case *keySpace < 2**active:
		return fmt.Errorf("-keys %d below 2 x -active %d: keys would come back before they go quiet", *keySpace, *active)
	case *mode != "sidecar" && *mode != "library":
		return fmt.Errorf("-mode %q: sidecar or library", *mode)
	case *delivery != string(adapter.DeliveryPerKey) && *delivery != string(adapter.DeliveryPartitioned):
		return fmt.Errorf("-delivery %q: %s or %s", *delivery, adapter.DeliveryPerKey, adapter.DeliveryPartitioned)
	case *report < sampleEvery:
		return fmt.Errorf("-report %v: at least %v", *report, sampleEvery)
	}
	return nil
}

func logger(level string) (*slog.Logger, error) {
	if level == "off" {
		return slog.New(slog.DiscardHandler), nil
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log %q: debug, info, warn, error or off", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

type soak struct {
	t      *target
	chk    *ordercheck.Checker
	counts []int // messages published per key id; the publisher's only

	published, pubErrors atomic.Int64
	// delivered counts first deliveries, repeats the deliveries of a
	// message delivered before (which the checker judges).
	delivered, repeats atomic.Int64

	mu     sync.Mutex
	pubErr error
	next   map[string]int // key -> index of its next first delivery

	samples                            []sample // during publishing
	failures                           []string
	drainStart, retireStart, retiredAt time.Time
	complete                           bool // every message delivered
	keyLeft                            int  // key consumers at the last count, -1 before
}

// handle checks a delivery; the target acks it after.
func (s *soak) handle(key string, data []byte) {
	k, idx, err := ordercheck.Decode(data)
	if err != nil || k != key {
		s.chk.Fail("undecodable delivery %q (key %q): %v", data, key, err)
		return
	}
	s.chk.Delivered(subID, k, idx)
	s.chk.Acked(subID, k, idx)
	s.mu.Lock()
	first := idx >= s.next[k]
	if first {
		s.next[k] = idx + 1
	}
	s.mu.Unlock()
	if first {
		s.delivered.Add(1)
	} else {
		s.repeats.Add(1)
	}
}

// startPublishing publishes at the set rate until ctx ends; the returned
// channel closes once every publish has its result.
func (s *soak) startPublishing(ctx context.Context, shift int, start time.Time) <-chan struct{} {
	results := make(chan result, 4*(*rate))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range results {
			gctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			_, err := r.Get(gctx)
			cancel()
			if err != nil {
				if s.pubErrors.Add(1) == 1 {
					s.mu.Lock()
					s.pubErr = err
					s.mu.Unlock()
				}
				continue
			}
			s.published.Add(1)
		}
	}()
	go func() {
		defer close(results)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		sent := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// Catch up to the schedule: a stalled publisher sends what it
			// owes rather than lowering the rate.
			due := int(time.Since(start).Seconds() * float64(*rate))
			for ; sent < due && ctx.Err() == nil; sent++ {
				pass, slot := sent / *active, sent%*active
				id := (pass*shift + slot) % *keySpace
				key := "key-" + strconv.Itoa(id)
				idx := s.counts[id]
				s.counts[id]++
				s.chk.Published(key, idx)
				results <- s.t.publish(key, ordercheck.Encode(key, idx))
			}
		}
	}()
	return done
}

func (s *soak) firstPubErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pubErr
}

// sample is one reading of the measures the growth check compares.
type sample struct {
	at                       time.Duration
	published, delivered     int64
	goroutines               int
	heapInuse, heapLive, rss uint64
	consumers                int
}

// sample reads the measures; a measure it cannot read is zero (and said on
// stderr).
func (s *soak) sample(at time.Duration) sample {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	smp := sample{
		at:         at,
		published:  s.published.Load(),
		delivered:  s.delivered.Load(),
		goroutines: runtime.NumGoroutine(),
		heapInuse:  ms.HeapInuse,
		heapLive:   live[0].Value.Uint64(),
	}
	var err error
	if smp.rss, err = rss(); err != nil {
		fmt.Fprintln(os.Stderr, "soak: RSS:", err)
	}
	if smp.consumers, err = s.t.consumers(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "soak: count consumers:", err)
	}
	return smp
}

// row is what the previous row printed, for rates.
type row struct {
	at                   time.Duration
	published, delivered int64
}

func printRow(phase string, smp sample, prev row) row {
	secs := (smp.at - prev.at).Seconds()
	fmt.Printf("%8s %-6s %10d %7.0f %10d %7.0f %8d %10d %7.1f MiB %6.1f MiB %4d MiB %10d\n",
		smp.at.Round(time.Second), phase, smp.published, float64(smp.published-prev.published)/secs,
		smp.delivered, float64(smp.delivered-prev.delivered)/secs, smp.published-smp.delivered,
		smp.goroutines, mib(smp.heapInuse), mib(smp.heapLive), smp.rss>>20, smp.consumers)
	return row{at: smp.at, published: smp.published, delivered: smp.delivered}
}

func writeHeapProfile() {
	if *heapProf == "" {
		return
	}
	f, err := os.Create(*heapProf)
	if err == nil {
		err = pprof.WriteHeapProfile(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: heap profile:", err)
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// rss is the process's resident set size, from /proc/self/status.
func rss() (uint64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("unexpected VmRSS line %q", line)
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc/self/status")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}
