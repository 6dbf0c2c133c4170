package main

import (
	"fmt"
	"slices"
	"time"
)

// A measure the growth check compares, with its tolerance.
type measure struct {
	name  string
	value func(sample) float64
	unit  string  // for the message; MiB values are in bytes
	rel   float64 // allowed relative growth of the median
	abs   float64 // plus this much, in the measure's own units
}

// The run is cut in thirds: the first is warm-up (consumers and the
// server's state fill up, the key space is seen for the first time) and is
// ignored; the median of the last third must not exceed the median of the
// middle third by more than rel plus abs. Medians over a third (~30
// samples at the default 3 minutes) ignore the sawtooth of garbage
// collection and single stalls on a shared machine; a leak shows as a
// trend, which moves the median by its slope times a third of the run.
//
// Tolerances. What they let through is measured against a leak at the
// default load (500 msgs/s, 125 new keys/s, so 30,000 messages and 7,500
// retired key consumers between the two medians, 60s apart); a longer
// -duration catches smaller leaks, as a leak grows with the run and the
// limits do not.
//
//   - backlog (published, not yet delivered): +100% plus 5 seconds of
//     publishing. A stall of the shared machine holds back a few seconds'
//     worth; delivery 10% short of the publish rate adds 6 seconds' worth
//     in 60s. It is listed first because the others follow it: a key with
//     messages waiting is not idle, so its consumer stays live.
//   - consumers: +25% +100. The live count is new keys/s times how long a
//     key lives (its messages, then the idle timeout and the clean-up
//     cadence): ~1,500 at the default load, moving by a fifth with
//     delivery delay on a busy machine. One consumer left per 16 retired
//     keys breaks the limit. The end of the run checks exactly that every
//     key consumer is retired once the keys go quiet, which catches a
//     slower consumer leak.
//   - goroutines: +25% +300. They follow the live consumers (nats-server
//     runs about three per consumer) and the messages in flight, so they
//     get the consumers' tolerance: ~1,500 over ~5,000. One goroutine left
//     per five retired keys breaks it.
//   - heap live (marked live by the last GC, so no GC sawtooth): +25%,
//     because most of it is per live consumer, +16 MiB for bounded
//     structures still filling after the warm-up, chiefly the stream's
//     duplicate window of 2 minutes of message ids (60,000 at the default
//     rate). At ~95 MiB the limit is ~40 MiB of growth: 5 KiB per retired
//     key or 1.3 KiB per message.
//   - RSS: +25% +32 MiB. RSS follows the heap's peaks plus goroutine
//     stacks and the runtime returns freed memory lazily, so it is noisier
//     than the live heap; at ~260 MiB the limit is ~100 MiB of growth.
func measures() []measure {
	return []measure{
		{"backlog", func(s sample) float64 { return float64(s.published - s.delivered) }, "", 1, float64(5 * *rate)},
		{"consumers", func(s sample) float64 { return float64(s.consumers) }, "", 0.25, 100},
		{"goroutines", func(s sample) float64 { return float64(s.goroutines) }, "", 0.25, 300},
		{"heap live", func(s sample) float64 { return float64(s.heapLive) }, "MiB", 0.25, 16 << 20},
		{"RSS", func(s sample) float64 { return float64(s.rss) }, "MiB", 0.25, 32 << 20},
	}
}

// judge compares the last third of the run with the middle third, prints
// the comparison and returns what grew past its tolerance.
func judge(samples []sample, run time.Duration) []string {
	var middle, last []sample
	for _, s := range samples {
		switch {
		case s.at >= 2*run/3:
			last = append(last, s)
		case s.at >= run/3:
			middle = append(middle, s)
		}
	}
	if len(middle) < 3 || len(last) < 3 {
		return []string{fmt.Sprintf("too few samples to judge growth: %d in the middle third, %d in the last", len(middle), len(last))}
	}
	fmt.Printf("growth, median of the last third (%v-%v, %d samples) against the middle third (%v-%v, %d samples):\n",
		2*run/3, run, len(last), run/3, 2*run/3, len(middle))
	var failures []string
	for _, m := range measures() {
		mid, end := median(middle, m.value), median(last, m.value)
		limit := mid*(1+m.rel) + m.abs
		verdict := "ok"
		if end > limit {
			verdict = "GREW"
			f := fmt.Sprintf("%s grew from %s to %s (median, middle to last third), over the limit %s (+%.0f%% +%s)",
				m.name, m.format(mid), m.format(end), m.format(limit), 100*m.rel, m.format(m.abs))
			if m.name == "backlog" {
				f += ": delivery fell behind publishing, and consumers, goroutines and memory follow the backlog"
			}
			failures = append(failures, f)
		}
		fmt.Printf("  %-10s %10s -> %10s  (%+6.1f%%; limit %s)  %s\n", m.name, m.format(mid), m.format(end), 100*(end-mid)/max(mid, 1), m.format(limit), verdict)
	}
	return failures
}

func (m measure) format(v float64) string {
	if m.unit == "MiB" {
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%.0f", v)
}

func median(samples []sample, value func(sample) float64) float64 {
	v := make([]float64, len(samples))
	for i, s := range samples {
		v[i] = value(s)
	}
	slices.Sort(v)
	return v[len(v)/2]
}
